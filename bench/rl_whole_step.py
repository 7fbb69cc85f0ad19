"""The whole RL step, rollouts included, as a trainer job runs it: time and peak memory per variant.

    python bench/rl_whole_step.py --model runs/<id>/jobs/<sft job>/checkpoint-24
    python bench/rl_whole_step.py --model CKPT --variants full-fp32,lora16-micro1-nogc-bf16 --steps 3

``bench/rl_step.py`` replays fixed episodes to time the trainer's side of a step; this bench times
what a user waits for: ``make run``'s DAPO job (when-to-search on the synthetic world, the cpu
preset: 2 questions x 4 episodes of 4 turns of 96 tokens) from a warm start that searches, each
step its 8 episodes (no dynamic-sampling refills) rolled out against a live retriever, their
rewards, the loss and the optimizer step. Each variant is a real trainer job
(:func:`services.trainer.jobs.submit` into a registry of the bench's own, run by the trainer's
worker, :func:`services.trainer.worker.main`, in a process of its own as the trainer service
launches it) with the variant's hyperparameters and environment
(``bench/rl_step.py``'s variant names: ``full``, ``lora16-micro1-nogc``, ... with ``-bf16`` /
``-fp32``; then ``-unmerged``: LoRA rollouts decode with the adapters apart, as before
:func:`hoprl.training.lora.adapters_merged`; ``-fp32rollouts``: rollouts decode in fp32 whatever
training's precision, ``HOPRL_ROLLOUT_BF16=0``; ``-fp32prefill`` / ``-bf16prefill``: their prompts
prefill in fp32 / under bf16 autocast, ``HOPRL_ROLLOUT_PREFILL_BF16``, by default as training;
``-repeatkv``: masked decode steps repeat the key/value heads, as transformers' sdpa does, before
:func:`hoprl.generation.attention.kernel_gqa`).
Every variant starts from the same checkpoint, seed and questions.

Reported per variant, from the job's own metrics (``step_time``, ``rollout_s``,
``completions/mean_length``, ``searches``) and the worker's resource usage: each step's time and
rollout time, the median of the steps after the first (the first warms up the engine, threads and
allocators; with one step, that step), the rollouts' seconds per thousand completion tokens (the
policy's sampled tokens, as TRL counts them: retrieved text excluded; the variants sample
different episodes, and a rollout's time follows what it samples), and the worker's
peak resident memory (``ru_maxrss`` of the process, from ``wait4``); the seconds of the frozen
copy's forward pass for the KL to the warm start (``warm_start_kl/forward_s``); and where the
rollouts' time went (the engine's counters, ``rollout/*``): seconds of prefill (summed over the two prefill
threads, which run beside the decode thread) and of decode steps, and the rows a decode step held
on average. The first variant is the reference of the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: set in a variant's worker: LoRA rollouts decode with the adapters apart (``-unmerged``)
UNMERGED = "HOPRL_BENCH_UNMERGED"
#: set in a variant's worker: rollouts attend with transformers' sdpa, heads repeated (``-repeatkv``)
REPEAT_KV = "HOPRL_BENCH_REPEAT_KV"
#: episodes a step of ``make run``'s DAPO job rolls out (the cpu preset: 2 questions x 4)
EPISODES = 8
#: the rollout engine's counters per step (:func:`hoprl.training.rollout.counter_stats`)
ENGINE_KEYS = ("rollout/prefill_s", "rollout/prefill_tokens", "rollout/decode_s", "rollout/rows_per_step")
#: the seconds a step's frozen copy spent scoring the KL to the warm start (the cpu preset's 2 episodes)
KL_FORWARD = "warm_start_kl/forward_s"
#: ``make run``'s dataset: the synthetic world, seed 0, questions of up to 2 hops
DATASET = "synthetic:0:2"


def job_request(model: str, steps: int, options: dict[str, Any]) -> Any:
    """``make run``'s DAPO job (:func:`flows.pipeline.job_hyperparameters` with the cpu preset) from
    ``model``, with ``options`` over its hyperparameters, a checkpoint only at the last step and no
    dynamic sampling (a flat group's refill would add rollouts to one variant's step and not to
    another's: the step is the 8 episodes)."""
    from flows.pipeline import job_hyperparameters
    from hoprl.schemas.trainer import JobRequest

    # no refills: every step rolls out exactly its 8 episodes, whatever the variant samples
    fixed = {"save_steps": steps, "dynamic_sampling": False}
    hp = job_hyperparameters("when-to-search", steps, {**fixed, **options}, None, "cpu")
    return JobRequest(recipe="when-to-search", objective="dapo", dataset=DATASET, model=model, steps=steps,
                      seed=0, hyperparameters=hp)  # fmt: skip


#: this bench's own suffixes, after ``bench/rl_step.py``'s: the worker's environment they add
ROLLOUT_SUFFIXES = {
    "-unmerged": (UNMERGED, "1"), "-repeatkv": (REPEAT_KV, "1"), "-fp32rollouts": ("HOPRL_ROLLOUT_BF16", "0"),
    "-fp32prefill": ("HOPRL_ROLLOUT_PREFILL_BF16", "0"), "-bf16prefill": ("HOPRL_ROLLOUT_PREFILL_BF16", "1"),
}  # fmt: skip


#: this bench's suffixes that set hyperparameters, last in a name: ``-klall``, the frozen copy
#: scores the KL to the warm start on every episode of the step, as passes of fewer episodes than
#: ``warm_start_kl`` did before 2026-12-07 (the cpu preset's default scores 2)
HYPERPARAMETER_SUFFIXES: dict[str, dict[str, Any]] = {"-klall": {"warm_start_kl": EPISODES}}


def variant(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A variant name's hyperparameters and its worker's environment: ``bench/rl_step.py``'s names
    and suffixes, :data:`ROLLOUT_SUFFIXES` (``lora16-micro1-nogc-bf16-fp32rollouts``) and, last,
    :data:`HYPERPARAMETER_SUFFIXES` (``lora16-micro1-bf16-klall``).

    That script is read by its path: neither folder of the benches goes on ``sys.path`` (bench/
    holds ``train.py``, ``policy.py``, ... that would shadow other modules for the rest of the
    process)."""
    extra: dict[str, Any] = {}
    for suffix, options in HYPERPARAMETER_SUFFIXES.items():
        if name.endswith(suffix):
            name, extra = name.removesuffix(suffix), {**extra, **options}
    spec = importlib.util.spec_from_file_location("bench_rl_step", Path(__file__).with_name("rl_step.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    options, env = module.split_variant(name, {**module.SUFFIXES, **ROLLOUT_SUFFIXES})
    return {**options, **extra}, env


def worker(run_id: str) -> int:
    """The trainer's worker on ``run_id``, with the LoRA rollouts unmerged and the heads repeated
    when the variant says so."""
    from contextlib import nullcontext

    from hoprl.training import rollout
    from services.trainer.worker import main as work

    rollout.AgentRollout.merge_adapters = os.environ.get(UNMERGED) != "1"
    if os.environ.get(REPEAT_KV) == "1":
        rollout.kernel_gqa = lambda model: nullcontext()  # type: ignore[assignment]
    return work([run_id])


def run_variant(
    name: str, model: str, steps: int, work: Path, retriever_url: str, threads: int
) -> dict[str, Any]:
    """One variant as a trainer job in a worker process of its own; its figures (module docstring)."""
    from hoprl.registry.store import Registry
    from services.trainer.jobs import submit

    options, env = variant(name)
    database = f"sqlite:///{work / 'registry.db'}"
    with Registry(database) as registry:
        run_id = submit(registry, job_request(model, steps, options)).id
    worker_env = {
        **os.environ, "PYTHONPATH": str(ROOT), "TRAINER_DATABASE_URL": database,
        "TRAINER_RUNS_DIR": str(work / "runs"), "TRAINER_RETRIEVER_URL": retriever_url,
        "TRAINER_MODEL_ROOTS": str(Path(model).resolve().parent), "TRAINER_TORCH_THREADS": str(threads),
        "TRL_EXPERIMENTAL_SILENCE": "1", **env,
    }  # fmt: skip
    log = (work / f"{name}.log").open("wb")
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--worker", run_id], cwd=ROOT, env=worker_env,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    log.close()
    with Registry(database) as registry:
        run = registry.get_run(run_id)
        if proc.returncode != 0 or run is None or run.status != "succeeded":
            tail = (work / f"{name}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"variant {name}: the job ended {run.status if run else '?'}:\n{tail}")
        keys = ("step_time", "rollout_s", "completions/mean_length", "searches", KL_FORWARD, *ENGINE_KEYS)
        series = {key: [v for _, v in registry.metric_series(run_id, key)] for key in keys}
    steps_s, rollouts_s = series["step_time"], series["rollout_s"]
    # the tokens each rollout sampled (TRL counts the env mask's ones: the retrieved text is not)
    tokens = [round(mean * EPISODES) for mean in series["completions/mean_length"]]
    timed = slice(1, None) if len(steps_s) > 1 else slice(None)
    step_s, rollout_s = statistics.median(steps_s[timed]), statistics.median(rollouts_s[timed])
    per_k = statistics.median(
        1000 * s / max(n, 1) for s, n in zip(rollouts_s[timed], tokens[timed], strict=True)
    )
    engine = {key.removeprefix("rollout/"): round(statistics.median(series[key][timed]), 2)
              for key in ENGINE_KEYS if series[key]}  # fmt: skip
    return {
        "variant": name, "steps_s": [round(s, 1) for s in steps_s],
        "rollouts_s": [round(s, 1) for s in rollouts_s], "step_s": round(step_s, 1),
        "rollout_s": round(rollout_s, 1), "loss_s": round(step_s - rollout_s, 1),
        "completion_tokens": tokens, "rollout_s_per_1k_tokens": round(per_k, 2),
        "searches": [round(v, 2) for v in series["searches"]],
        "kl_forward_s": round(statistics.median(kl_s[timed]), 1) if (kl_s := series[KL_FORWARD]) else None,
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2), "wall_s": round(wall, 1), "threads": threads,
        "engine": engine, "options": options, "env": env,
    }  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    """The results as a markdown table, the first variant the reference of ``x ref``."""
    ref = results[0]["step_s"]
    lines = ["| variant | step s | x ref | rollouts s | s / 1k tokens | prefill s | decode s | rows a step "
             "| rest s | KL forward s | peak RSS GiB | steps s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in results:
        steps = ", ".join(map(str, r["steps_s"]))
        engine = [r.get("engine", {}).get(key, "") for key in ("prefill_s", "decode_s", "rows_per_step")]
        kl = "" if r["kl_forward_s"] is None else r["kl_forward_s"]  # None: no KL measured (warm_start_kl 0)
        cells = [f"`{r['variant']}`", r["step_s"], f"{r['step_s'] / ref:.2f}", r["rollout_s"],
                 r["rollout_s_per_1k_tokens"], *engine, r["loss_s"], kl, r["peak_rss_gib"],
                 steps]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", required=True, help="a warm start that searches (an SFT checkpoint)")
    parser.add_argument(
        "--variants", default="full-fp32,lora16-micro1-nogc-bf16,lora16-micro1-nogc-bf16-fp32rollouts"
    )
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per variant (1st: warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="the worker's torch threads")
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a variant's worker process: its run id
    if "--worker" in sys.argv:
        raise SystemExit(worker(sys.argv[sys.argv.index("--worker") + 1]))
    args = parser.parse_args()
    from services.local import LocalServer
    from services.retriever.app import create_app
    from services.retriever.settings import RetrieverSettings

    names = args.variants.split(",")
    for name in names:
        variant(name)  # an unknown name stops the bench before any job runs
    results = []
    with tempfile.TemporaryDirectory(prefix="rl-whole-step-") as tmp:
        work = Path(tmp)
        with LocalServer(create_app(RetrieverSettings(storage_path=work / "qdrant"))) as retriever:
            for name in names:
                results.append(run_variant(name, args.model, args.steps, work, retriever.url, args.threads))
                print(json.dumps(results[-1]), flush=True)
    print("\n" + table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
