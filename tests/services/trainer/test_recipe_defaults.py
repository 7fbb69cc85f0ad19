"""Every recipe trains with its paper's settings unless the request says otherwise.

Each row of :data:`PAPER` is (recipe, objective, setting, value, where the paper gives it). The
value is written here by hand from the paper's full text (the section, table or appendix is
named; ``docs/papers.md`` lists them all), never read from the
configs: a job request that sets nothing must resolve to it. The trainer's ``paper`` preset reads
``configs/<recipe>.yaml``; ``tests/hoprl/test_papers_table.py`` checks the files against
docs/papers.md. ``objective=None`` means the request names no objective: the recipe's own applies.

Also pinned: the ``cpu`` preset's sizes (``make run``, ``hoprl pipeline --small``), a value the
request sets winning over both, the objective a request without one trains with, and that the
request ``make run`` makes the pipeline send resolves to the cpu preset.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.pipeline import add_arguments, pipeline_options
from flows.pipeline import job_hyperparameters, job_request
from flows.stack import policy_limits
from hoprl import jobspec
from hoprl.agent.grammar import grammar
from hoprl.configs import recipe_objective
from hoprl.jobspec import job_episode_shape
from hoprl.recipes import get_recipe
from hoprl.registry.store import Registry
from hoprl.schemas.trainer import Hyperparameters, JobRequest
from services.local import LocalServer
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[3]
SEARCH_R1 = "Search-R1's released script scripts/nq_hotpotqa/v0.2/train_grpo.sh (docs/papers.md)"
SEARCH_R1_PPO = "Search-R1's released script scripts/nq_hotpotqa/v0.2/train_ppo.sh (docs/papers.md)"

#: recipe config values the trainer's episodes use: read from the recipe the job builds
RECIPE_CONFIG = ("top_k", "l_max", "t_max", "recipe.max_steps")

PAPER: list[tuple[str, str | None, str, Any, str]] = [
    # R2AG: Eq. 6 (DAPO's token-level clipped objective, no KL, groups with reward spread), App. B.2
    ("r2ag", None, "objective", "dapo", "R2AG §2.4, Eq. 6"),
    ("r2ag", None, "beta", 0.0, "R2AG Eq. 6 has no KL term"),
    ("r2ag", None, "epsilon", 0.2, "R2AG App. B.2: eps_low 0.2"),
    ("r2ag", None, "epsilon_high", 0.28, "R2AG App. B.2: eps_high 0.28"),
    ("r2ag", None, "dynamic_sampling", True, "R2AG Eq. 6: s.t. std({R_i}) > 0"),
    ("r2ag", None, "dynamic_sampling_signal", "rewards", "R2AG Eq. 6: s.t. std({R_i}) > 0"),
    ("r2ag", None, "learning_rate", 1e-6, "R2AG App. B.2: initial learning rate 1e-6 (AdamW)"),
    ("r2ag", None, "questions_per_step", 128, "R2AG App. B.2: prompt batch size 128"),
    ("r2ag", None, "num_generations", 12, "R2AG App. B.2: group size 12"),
    ("r2ag", None, "max_new_tokens_per_step", 4096, "R2AG App. B.2: 4,096 output tokens at most"),
    ("r2ag", None, "top_k", 1, "R2AG App. B.2: k = 1 during training"),
    ("r2ag", None, "l_max", 5, "R2AG §3.2, App. B.2: 5 retrieval iterations"),
    # when-to-search: DAPO (§3.2), Table 5, §4.2
    ("when-to-search", None, "objective", "dapo", "when-to-search §3.2"),
    ("when-to-search", None, "beta", 0.0, "when-to-search §3.2: DAPO removes the KL term"),
    ("when-to-search", None, "dynamic_sampling", True, "when-to-search §3.2: dynamic sampling"),
    ("when-to-search", None, "dynamic_sampling_signal", "answers", "§3.2 DAPO, Eq. 11"),
    ("when-to-search", None, "learning_rate", 1e-6, "when-to-search Table 5: lr 1e-6"),
    ("when-to-search", None, "questions_per_step", 32, "when-to-search Table 5: batch_size 32"),
    ("when-to-search", None, "num_generations", 32, "when-to-search Table 5: n 32"),
    ("when-to-search", None, "temperature", 1.0, "when-to-search Table 5: temperature 1.0"),
    ("when-to-search", None, "max_steps", 5, "when-to-search Table 5: max_steps 5"),
    ("when-to-search", None, "token_budget", 16384, "when-to-search Table 5: max_response_length 16384"),
    ("when-to-search", None, "save_steps", 30, "when-to-search App. B.3: a checkpoint every 30 steps"),
    ("when-to-search", None, "top_k", 5, "when-to-search §4.2: top-k 5"),
    ("when-to-search", None, "recipe.max_steps", 5, "when-to-search Table 5: 5 turns (the recipe's own cap)"),
    # Eval-RAR: GRPO (§4.2.4), App. A.2, §5.1
    ("eval-rar", None, "objective", "grpo", "Eval-RAR §4.2.4"),
    ("eval-rar", None, "learning_rate", 1e-6, "Eval-RAR App. A.2: lr 1e-6"),
    ("eval-rar", None, "num_generations", 5, "Eval-RAR App. A.2: G = 5"),
    ("eval-rar", None, "beta", 0.001, "Eval-RAR App. A.2: beta 0.001"),
    ("eval-rar", None, "epsilon", 0.2, "Eval-RAR App. A.2: clip 0.2"),
    ("eval-rar", None, "top_k", 3, "Eval-RAR §5.1: top-3 documents"),
    ("eval-rar", None, "questions_per_step", 512, "Eval-RAR App. A.2: a total training batch of 512"),
    # ARENA: GRPO with the k2 KL (§3.2), App. E
    ("arena", None, "objective", "grpo", "ARENA §3.2"),
    ("arena", None, "kl_estimator", "k2", "ARENA §3.2: 1/2 (log pi/pi_ref)^2 in place of k3"),
    ("arena", None, "learning_rate", 3e-6, "ARENA App. E: learning rate 3e-6"),
    ("arena", None, "num_generations", 7, "ARENA App. E: 7 rollouts per input"),
    ("arena", None, "temperature", 0.9, "ARENA App. E: temperature 0.9"),
    ("arena", None, "questions_per_step", 252, "ARENA App. E: batch 256; 7 processes x 36 whole groups"),
    # EVO-RAG: GRPO with per-step normalisation (§3.4, App. A.5), Table 10, App. A.2
    ("evo-rag", None, "objective", "grpo", "EVO-RAG App. A.5, Table 7"),
    ("evo-rag", None, "advantage", "siblings", "EVO-RAG §3.4, App. A.5: normalised over sibling candidates"),
    ("evo-rag", None, "preference_model", True, "EVO-RAG §3.4, Algorithm 1: the 7-head model"),
    ("evo-rag", None, "max_steps", 20, "EVO-RAG App. A.2: T_max = 20"),
    ("evo-rag", None, "t_max", 20, "EVO-RAG App. A.2: T_max = 20"),
    ("evo-rag", None, "learning_rate", 1e-6, "EVO-RAG Table 10: actor lr 1e-6"),
    ("evo-rag", None, "beta", 0.0, "EVO-RAG Table 10: GRPO KL coefficient 0.0"),
    ("evo-rag", None, "questions_per_step", 16, "EVO-RAG Table 10: GRPO train batch 16"),
    ("evo-rag", None, "max_new_tokens_per_step", 256, "EVO-RAG Table 10: response length 256"),
    ("evo-rag", "ppo", "beta", 0.001, "EVO-RAG Table 10: PPO KL coefficient 0.001"),
    ("evo-rag", "ppo", "learning_rate", 1e-6, "EVO-RAG Table 10: actor lr 1e-6"),
    ("evo-rag", "ppo", "critic", "separate", "EVO-RAG Table 10: a separate critic model"),
    ("evo-rag", "ppo", "critic_learning_rate", 1e-5, "EVO-RAG Table 10: critic lr 1e-5"),
    ("evo-rag", "ppo", "questions_per_step", 128, "EVO-RAG Table 10: PPO train batch 128"),
    # the Search-R1 baseline: its authors' reproduction scripts
    ("search-r1", None, "objective", "grpo", f"{SEARCH_R1}: algorithm.adv_estimator=grpo"),
    ("search-r1", None, "num_generations", 5, f"{SEARCH_R1}: rollout.n_agent=5"),
    ("search-r1", None, "learning_rate", 1e-6, f"{SEARCH_R1}: actor optim.lr=1e-6"),
    ("search-r1", None, "beta", 0.001, f"{SEARCH_R1}: kl_loss_coef=0.001"),
    ("search-r1", None, "kl_estimator", "k3", f"{SEARCH_R1}: kl_loss_type=low_var_kl (k3, clamped)"),
    ("search-r1", None, "epsilon", 0.2, f"{SEARCH_R1} and verl's ppo_trainer.yaml: clip_ratio 0.2"),
    ("search-r1", None, "temperature", 1.0, f"{SEARCH_R1}: rollout.temperature=1"),
    ("search-r1", None, "max_steps", 4, f"{SEARCH_R1}: max_steps=4"),
    ("search-r1", None, "top_k", 3, f"{SEARCH_R1}: retriever.topk=3"),
    ("search-r1", "ppo", "learning_rate", 1e-6, f"{SEARCH_R1_PPO}: actor optim.lr=1e-6"),
    ("search-r1", "ppo", "critic_learning_rate", 1e-5, f"{SEARCH_R1_PPO}: critic.optim.lr=1e-5"),
    ("search-r1", "ppo", "beta", 0.001, f"{SEARCH_R1_PPO}: algorithm.kl_ctrl.kl_coef=0.001"),
    ("naive-rag", None, "top_k", 3, f"{SEARCH_R1}: the same retriever.topk=3 for its RAG baseline"),
]

#: values no paper of ours gives, chosen by the project (docs/papers.md says why)
PROJECT: list[tuple[str, str, Any, str]] = [
    ("arena", "beta", 0.001, "ARENA App. E's KL coefficient is not legible in the stored text"),
    ("evo-rag", "top_k", 3, "EVO-RAG App. A.2 keeps k constant across runs without giving it"),
    (
        "evo-rag",
        "num_generations",
        4,
        "EVO-RAG's GRPO groups are siblings at a step; their count is not given",
    ),
    ("when-to-search", "epsilon_high", 0.28, "when-to-search names eps_high without a value: DAPO's own"),
    ("search-r1", "dynamic_sampling_signal", "answers", "no paper rule: DAPO's own (its Eq. 11)"),
]

#: the cpu preset, by hand: 2 questions x 4 samples a step, 4 turns of 96 tokens, 1152-token episodes
#: (3 turns of 96 + 2 blocks of 395 tokens + 64 of template = 1142: a two-search episode fits)
CPU = {
    "questions_per_step": 2,
    "num_generations": 4,
    "max_steps": 4,
    "max_new_tokens_per_step": 96,
    "token_budget": 1152,
    "save_steps": 5,
}


def resolve(recipe: str, objective: str | None = None, **hp: Any) -> tuple[JobRequest, Hyperparameters]:
    """A job request as a client sends it (JSON), validated and resolved as the trainer does."""
    body: dict[str, Any] = {"recipe": recipe, "hyperparameters": hp}
    if objective is not None:
        body["objective"] = objective
    request = JobRequest.model_validate(body)
    return request, jobspec.resolve(request.hyperparameters, request.recipe, request.objective)


def setting(request: JobRequest, hp: Hyperparameters, name: str) -> Any:
    if name == "objective":
        return request.objective
    if name in RECIPE_CONFIG:  # the recipe the job builds from the resolved config
        recipe = get_recipe(request.recipe, **hp.recipe_config)
        name = name.removeprefix("recipe.")
        return getattr(recipe, name) if hasattr(recipe, name) else getattr(recipe.config, name)
    return getattr(hp, name)


@pytest.mark.parametrize(("recipe", "objective", "name", "value", "source"), PAPER,
                         ids=[f"{r}-{o or 'default'}-{n}" for r, o, n, _, _ in PAPER])  # fmt: skip
def test_a_request_that_sets_nothing_trains_with_the_papers_value(
    recipe: str, objective: str | None, name: str, value: Any, source: str
) -> None:
    request, hp = resolve(recipe, objective)
    assert setting(request, hp, name) == value, f"{recipe} {name}: the paper's {value!r} ({source})"


@pytest.mark.parametrize(
    ("recipe", "name", "value", "why"), PROJECT, ids=[f"{r}-{n}" for r, n, _, _ in PROJECT]
)
def test_the_projects_own_choices(recipe: str, name: str, value: Any, why: str) -> None:
    request, hp = resolve(recipe)
    assert setting(request, hp, name) == value, why


@pytest.mark.parametrize("recipe", ["r2ag", "when-to-search", "eval-rar", "arena", "evo-rag", "search-r1"])
def test_the_cpu_preset_scales_sizes_and_keeps_the_papers_algorithm(recipe: str) -> None:
    request, hp = resolve(recipe, preset="cpu")
    assert {k: getattr(hp, k) for k in CPU} == CPU
    paper_request, paper = resolve(recipe)
    assert request.objective == paper_request.objective
    for name in (
        "beta",
        "kl_estimator",
        "epsilon",
        "epsilon_high",
        "dynamic_sampling",
        "dynamic_sampling_signal",
        "advantage",
        "temperature",
    ):
        assert getattr(hp, name) == getattr(paper, name), name


def test_the_cpu_preset_trains_rl_at_its_own_learning_rate_and_sft_at_the_generic() -> None:
    """The papers' 1e-6 (configs) is for 7B-8B models over hundreds of steps; the cpu preset's RL
    jobs train SmolLM2-135M at 1e-5 for a few steps, its SFT warm start at the generic 3e-4 (None
    here: the trainer's SFT default fills it); the paper preset keeps the paper's 1e-6."""
    assert resolve("when-to-search", preset="cpu")[1].learning_rate == 1e-5
    assert resolve("when-to-search", "sft", preset="cpu")[1].learning_rate is None
    assert resolve("when-to-search")[1].learning_rate == 1e-6  # Table 5
    assert resolve("when-to-search", preset="cpu", learning_rate=2e-5)[1].learning_rate == 2e-5


def test_the_cpu_preset_fits_evo_rags_whole_schedule_into_its_four_steps() -> None:
    """T_max = 4 with 4 turns: p(t) = (t-1)/(T_max-1) reaches 1 at the last step, so the
    Refinement end-weights and r_act act (with T_max 20 capped at 4 turns p(t) stops at 3/19)."""
    _, hp = resolve("evo-rag", preset="cpu")
    recipe = get_recipe("evo-rag", **hp.recipe_config)
    assert hp.max_steps == recipe.config.t_max == recipe.max_steps == 4
    _, own = resolve("evo-rag", preset="cpu", recipe_config={"t_max": 6})
    assert own.recipe_config["t_max"] == 6  # the request's recipe config wins over the preset's


def test_a_value_the_request_sets_wins_over_the_preset_and_the_paper() -> None:
    _, hp = resolve("search-r1", preset="cpu", num_generations=7, max_steps=3, beta=0.0, learning_rate=3e-5)
    assert (hp.num_generations, hp.max_steps, hp.beta, hp.learning_rate) == (7, 3, 0.0, 3e-5)
    _, hp = resolve("when-to-search", epsilon_high=0.25, dynamic_sampling=False, recipe_config={"top_k": 2})
    assert (hp.epsilon_high, hp.dynamic_sampling) == (0.25, False)
    assert get_recipe("when-to-search", **hp.recipe_config).top_k == 2
    # EVO-RAG's token budget is derived from its config and follows the request's top_k and T_max:
    # 5 steps x (256 generated, Table 10 + 2 documents x 200 tokens) = 3280
    _, hp = resolve("evo-rag", recipe_config={"top_k": 2, "t_max": 5})
    assert hp.token_budget == 5 * (256 + 2 * 200)


def test_an_explicit_objective_wins_and_picks_its_own_paper_settings() -> None:
    request, hp = resolve("r2ag", "grpo")
    assert request.objective == "grpo" and hp.epsilon_high == 0.28  # the recipe's clip stays
    request, hp = resolve("search-r1", "ppo")
    assert request.objective == "ppo" and (hp.learning_rate, hp.critic_learning_rate) == (1e-6, 1e-5)
    request, hp = resolve("search-r1", "sft")  # a warm start keeps the generic SFT learning rate
    assert request.objective == "sft" and hp.learning_rate is None
    assert JobRequest.model_validate({"recipe": "when-to-search", "objective": None}).objective == "dapo"
    assert [recipe_objective(r) for r in ("r2ag", "when-to-search", "evo-rag", "unknown")] == [
        "dapo", "dapo", "grpo", "grpo"
    ]  # fmt: skip


def test_post_v1_jobs_stores_the_resolved_objective_and_settings(tmp_path: Path) -> None:
    """Over HTTP, as a client submits: the run row and its stored config hold what it trains with."""
    db = f"sqlite:///{tmp_path / 'registry.db'}"  # the queue polls hourly: the job stays queued, no worker
    settings = TrainerSettings(database_url=db, runs_dir=tmp_path / "runs", poll_interval_s=3600)
    with LocalServer(create_app(settings)) as server, httpx.Client(base_url=server.url) as http:
        created = http.post("/v1/jobs", json={"recipe": "when-to-search"})
        assert created.status_code == 201, created.text
        job = http.get(f"/v1/jobs/{created.json()['id']}").json()
    assert job["objective"] == "dapo"
    run = Registry(settings.database_url).get_run(job["id"])
    assert run is not None and run.objective == "dapo"
    stored = run.config["hyperparameters"]
    assert (stored["epsilon_high"], stored["dynamic_sampling"], stored["beta"], stored["max_steps"]) == (
        0.28, True, 0.0, 5
    )  # fmt: skip
    assert run.config["request"]["objective"] == "dapo" and stored["preset"] == "paper"


def make_run_command() -> list[str]:
    """The ``hoprl pipeline`` command line ``make run`` runs (make's dry run prints it)."""
    out = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if " pipeline " in line and "hoprl" in line)
    argv = shlex.split(line)
    return argv[argv.index("pipeline") + 1 :]


def test_make_run_sends_trainer_jobs_with_the_cpu_preset() -> None:
    """``make run``'s options, parsed by the command's own parser, make the pipeline send a trainer
    request that the trainer resolves to the cpu sizes; the policy it starts evaluates in that
    shape (flows/stack.py policy_limits)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = pipeline_options(parser.parse_args(make_run_command()))
    assert options["preset"] == "cpu"
    data = {"counts": {"train": 6}, "source": "synthetic", "paths": {"train": "unused.jsonl"}}
    hp = job_hyperparameters(options["recipe"], options["steps"], options["hyperparameters"], None,
                             options["preset"])  # fmt: skip
    body = job_request(options["recipe"], recipe_objective(options["recipe"], options["objective"]),
                       options["dataset"], data, "collection", options["seed"], hp)  # fmt: skip
    request = JobRequest.model_validate(body)
    hp = jobspec.resolve(request.hyperparameters, request.recipe, request.objective)
    assert {k: getattr(hp, k) for k in CPU} == CPU
    assert request.objective == "dapo"  # when-to-search's paper objective, sizes scaled only
    limits = policy_limits(job_episode_shape(body))  # the pipeline's own call
    assert limits["POLICY_MAX_STEPS"] == str(CPU["max_steps"])
    # the served step is the trained one, decoded free as in training (a request's constrained=true
    # still gets the grammar, whose answers keep 9 tokens at 96: the pipeline never asks for it)
    assert limits["POLICY_MAX_NEW_TOKENS_PER_STEP"] == str(CPU["max_new_tokens_per_step"])
    assert "answer_line[max_tokens=9]" in grammar("when-to-search", max_tokens=96).lark
    assert limits["POLICY_TOKEN_BUDGET"] == str(CPU["token_budget"])
    assert limits["POLICY_CONSTRAINED_DECODING"] == "false"


def test_evo_rag_pipelines_on_the_cpu_preset_check_the_curriculum_with_the_trained_config() -> None:
    """The flow writes the preset's recipe config into its request: its dev checks and curriculum
    read T_max 4, the one the trainer trains with."""
    data = {"counts": {"train": 6}, "source": "synthetic", "paths": {"train": "unused.jsonl"}}
    body = job_request(
        "evo-rag", "grpo", "synthetic", data, "c", 0, job_hyperparameters("evo-rag", 4, None, None, "cpu")
    )
    assert body["hyperparameters"]["recipe_config"] == {"t_max": 4}
    paper = job_request(
        "evo-rag", "grpo", "synthetic", data, "c", 0, job_hyperparameters("evo-rag", 4, None, None)
    )
    assert paper["hyperparameters"]["recipe_config"] == {}
