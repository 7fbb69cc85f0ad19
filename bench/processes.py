"""Multi-process training on CPU: step time of a job in 2 processes against 1, same global batch.

    python bench/processes.py                       # bundled SmolLM2-135M, synthetic world, 4 steps
    python bench/processes.py --steps 6 --json

Goes through the product path: a local retriever and a local trainer service (real HTTP), one
job per configuration submitted through ``TrainerClient`` (``processes: 1``, then ``processes: 2``
launched by the trainer with ``accelerate launch``, DDP over gloo), each with the same global batch
(``--questions`` GRPO groups of ``--generations`` samples per step). From the registry it reads each
step's ``step_time`` (TRL: the whole optimizer step) and ``rollout_s`` (the agent loop's share of
it: generation, retrieval, tokenization), and prints the medians over the steps after the first
(the first pays for loading), their ratio (2 processes / 1), and the rollout's share of a step.
Timings on shared machines are noisy: compare the ratio within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hoprl.clients.trainer import TrainerClient
from hoprl.data.jsonl import write_questions
from hoprl.data.synthetic import generate
from hoprl.registry.store import Registry
from services.local import LocalServer
from services.retriever.app import create_app as create_retriever
from services.retriever.settings import RetrieverSettings
from services.trainer.app import create_app as create_trainer
from services.trainer.settings import TrainerSettings


def job(dataset: Path, args: argparse.Namespace, processes: int) -> dict[str, Any]:
    return {
        "recipe": "search-r1", "objective": "grpo", "dataset": str(dataset), "steps": args.steps,
        "seed": 0,
        "hyperparameters": {"questions_per_step": args.questions, "num_generations": args.generations,
                            "max_steps": 2, "max_new_tokens_per_step": args.tokens,
                            "token_budget": 4 * args.tokens, "save_steps": args.steps,
                            "processes": processes},
    }  # fmt: skip


def medians(registry: Registry, run_id: str) -> dict[str, float]:
    out = {}
    for name in ("step_time", "rollout_s"):
        values = [v for step, v in registry.metric_series(run_id, name) if step > 1]
        out[name] = statistics.median(values) if values else float("nan")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--questions", type=int, default=2, help="GRPO groups per step (global)")
    parser.add_argument("--generations", type=int, default=2, help="samples per question")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per agent step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hoprl-bench-processes-"))
    dataset = root / "train.jsonl"
    write_questions(dataset, generate(seed=0)["train"][:16])
    results: dict[int, dict[str, float]] = {}
    with LocalServer(create_retriever(RetrieverSettings(storage_path=root / "qdrant"))) as retriever:
        settings = TrainerSettings(database_url=f"sqlite:///{root / 'registry.db'}", runs_dir=root / "runs",
                                   retriever_url=retriever.url, poll_interval_s=0.5, torch_threads=1,
                                   data_roots=[root], max_processes=2)  # fmt: skip
        with LocalServer(create_trainer(settings)) as server, TrainerClient(server.url) as client:
            for processes in (1, 2):
                start = time.monotonic()
                run_id = client.submit(job(dataset, args, processes)).id
                while (status := client.get(run_id).status) in ("queued", "running"):
                    time.sleep(2)
                if status != "succeeded":
                    raise SystemExit(f"{processes}-process job {run_id} {status}: see {root}/runs/{run_id}")
                with Registry(settings.database_url) as registry:
                    results[processes] = {**medians(registry, run_id), "wall_s": time.monotonic() - start}
    one, two = results[1], results[2]
    summary = {
        "steps": args.steps, "global_batch": args.questions * args.generations,
        "one_process": one, "two_processes": two,
        "step_time_ratio_2_over_1": two["step_time"] / one["step_time"],
        "rollout_share": {"1": one["rollout_s"] / one["step_time"], "2": two["rollout_s"] / two["step_time"]},
    }  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"global batch {summary['global_batch']} completions, medians over steps 2..{args.steps}")
    for name, r in (("1 process", one), ("2 processes", two)):
        share = r["rollout_s"] / r["step_time"]
        print(f"{name:12s} step {r['step_time']:7.1f} s   rollout {r['rollout_s']:7.1f} s   "
              f"({share:.0%} of the step)   job wall {r['wall_s']:.0f} s")  # fmt: skip
    print(f"step time, 2 processes / 1: {summary['step_time_ratio_2_over_1']:.2f}")


if __name__ == "__main__":
    main()
