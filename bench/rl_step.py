"""Where an RL step's time and memory go on the trainer's side, against the arithmetic bound.

    python bench/rl_step.py                       # SmolLM2-135M, make run's batch, three variants
    python bench/rl_step.py --model runs/<id>/jobs/<sft job>/checkpoint-24 --steps 3
    python bench/rl_step.py --variants full,micro2,lora16-micro2 --out bench-out/rl_step.json

The batch is ``make run``'s DAPO step: 2 questions x 4 episodes of the cpu preset's shape (4 turns
of 96 tokens, 1,152-token episodes) for when-to-search on the synthetic world. Its episodes are the
expert's (the SFT data ``make run``'s warm start imitates: two searches and their retrieved text),
run through the agent loop against a live retriever on embedded storage and tokenized as the
trainer tokenizes rollouts, so the loss sees the token counts and masks of a real step. The rollout
itself is replayed (no generation): generation is timed by ``make run``'s own progress lines
(``rollout_s``), and LoRA does not change what the engine decodes.

Each variant runs in a process of its own (its peak resident memory is its own) through the
trainer's real code (:func:`hoprl.training.grpo.grpo_config`, :class:`HoprlGRPOTrainer`): ``steps``
optimizer steps with a checkpoint at the last. Reported per variant: the median step time (the
first step, which warms up allocators and threads, is left out when there are more), the
checkpoint's save time, peak RSS, trainable parameters, and the step's arithmetic: FLOPs
(``6 P T`` for full fine-tuning, forward plus both backward products; ``4 P T + 6 P_lora T`` for
LoRA, whose frozen weights need no weight gradient; ``2 P T`` more with gradient checkpointing,
TRL's default, which runs the forward again; ``T`` the padded tokens each pass computes) over the
machine's float32 matmul rate measured in the same process. Variants:

``full``                 today's ``make run`` step: every weight, the 8 episodes in one pass,
                         gradient checkpointing on (TRL's default)
``micro2``               every weight, passes of 2 episodes (``micro_batch=2``)
``micro2-nogc``          the same without gradient checkpointing
``lora16``               LoRA rank 16 on every linear layer (``lora_rank=16``), one pass
``lora16-micro2``        LoRA in passes of 2
``lora16-micro2-nogc``   LoRA in passes of 2 without gradient checkpointing
``lora16-micro1-nogc``   LoRA in passes of 1 without gradient checkpointing
``...-bf16``             any of the above under bf16 autocast (fp32 master weights;
                         ``HOPRL_BF16=1`` in the variant's process), e.g. ``full-bf16``,
                         ``lora16-micro1-bf16``: ``python bench/precision.py`` measured a
                         forward + backward 2.2-2.5x faster under autocast on a CPU with AVX512-BF16
                         and no AMX, where the trainer's detection leaves it off
``...-fp32``             the same with autocast forced off (``HOPRL_BF16=0``)
``...-trlhead``          the loss's log-probs as TRL computes them, at every position of the
                         sequence (the trainer's ``policy_tokens_only`` off): the step before
                         :mod:`hoprl.training.policy_head`

Each variant's arithmetic bound uses the float32 matmul rate; a bf16 variant's ``of_bound`` below 1
is the bf16 matmuls beating it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: set in a variant's process: the trainer computes the loss's log-probs as TRL does
TRL_HEAD = "HOPRL_BENCH_TRL_HEAD"
VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "micro2": {"micro_batch": 2},
    "micro2-nogc": {"micro_batch": 2, "gradient_checkpointing": False},
    "lora16": {"lora_rank": 16},
    "lora16-micro2": {"lora_rank": 16, "micro_batch": 2},
    "lora16-micro2-nogc": {"lora_rank": 16, "micro_batch": 2, "gradient_checkpointing": False},
    "lora16-micro1-nogc": {"lora_rank": 16, "micro_batch": 1, "gradient_checkpointing": False},
    "lora16-micro1": {"lora_rank": 16, "micro_batch": 1},
}
#: a variant name's suffixes: the environment of its process (bf16 autocast on or off; TRL's head)
SUFFIXES = {"-bf16": ("HOPRL_BF16", "1"), "-fp32": ("HOPRL_BF16", "0"), "-trlhead": (TRL_HEAD, "1")}


def split_variant(
    name: str, suffixes: dict[str, tuple[str, str]] = SUFFIXES
) -> tuple[dict[str, Any], dict[str, str]]:
    """A variant name's hyperparameters and its process's environment (``full-bf16`` is ``full``
    under ``HOPRL_BF16=1``); SystemExit for a name that is none. ``suffixes``: another bench's
    (``bench/rl_whole_step.py`` adds its own to these)."""
    env: dict[str, str] = {}
    found = True
    while found:
        found = False
        for suffix, (key, value) in suffixes.items():
            if name.endswith(suffix):
                name, env, found = name[: -len(suffix)], {key: value, **env}, True
    if name not in VARIANTS:
        known = ", ".join(VARIANTS)
        raise SystemExit(
            f"unknown variant {name!r}; one of {known}, each optionally with -bf16 or -fp32 and -trlhead"
        )
    return VARIANTS[name], env


def matmul_flops(threads: int, size: int = 1024, seconds: float = 2.0) -> float:
    """The machine's float32 matmul rate (FLOP/s) on ``threads`` threads: the best of repeated runs."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def expert_rows(model: str, out: Path, seed: int) -> list[dict[str, Any]]:
    """The 8 episodes of make run's first step as token rows (prompt, completion, mask)."""
    from transformers import AutoTokenizer

    from hoprl.agent.tokens import to_token_trajectory
    from hoprl.clients.retriever import RetrieverClient
    from hoprl.data.corpus import pool
    from hoprl.data.synthetic import generate
    from hoprl.evaluation import corpus_collection, ensure_indexed
    from hoprl.jobspec import preset_recipe_config
    from hoprl.recipes import get_recipe
    from hoprl.training.sft import expert_episodes
    from services.local import LocalServer
    from services.retriever.app import create_app
    from services.retriever.settings import RetrieverSettings

    splits = generate(seed=seed)
    questions = list(splits["train"][:8])
    recipe = get_recipe("when-to-search", **preset_recipe_config("cpu", "when-to-search"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    with LocalServer(create_app(RetrieverSettings(storage_path=out / "qdrant"))) as server:
        documents = pool(list(splits["train"]) + list(splits["dev"]))
        name = corpus_collection("bench-rl-step", documents)
        with RetrieverClient(server.url) as client:
            ensure_indexed(client, name, documents)
        episodes = asyncio.run(expert_episodes(recipe, questions, server.url, name, seed=seed))
    rows = []
    for episode in episodes:
        t = to_token_trajectory(episode, tokenizer)
        rows.append({"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids, "mask": t.mask})
    return rows


class Replay:
    """TRL's rollout_func handing back the same rows each step; rewards 1, 0, 1, 0, ... so every
    group has spread (every row carries an advantage)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        rows = [self.rows[i % len(self.rows)] for i in range(len(prompts))]
        return {
            "prompt_ids": [r["prompt_ids"] for r in rows],
            "completion_ids": [r["completion_ids"] for r in rows],
            "env_mask": [r["mask"] for r in rows],
            "logprobs": None,
            "paid": [float(i % 2 == 0) for i in range(len(rows))],
        }


def run_variant(name: str, model: str, rows_file: Path, steps: int, out: Path) -> dict[str, Any]:
    """One variant in this process: step times, save time, peak RSS, FLOPs (module docstring)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from hoprl.jobspec import resolve
    from hoprl.schemas.trainer import Hyperparameters
    from hoprl.training.grpo import HoprlGRPOTrainer, grpo_config
    from hoprl.training.lora import lora_config

    rows = json.loads(rows_file.read_text())
    HoprlGRPOTrainer.policy_tokens_only = os.environ.get(TRL_HEAD) != "1"
    options, _ = split_variant(name)
    hp = resolve(Hyperparameters(preset="cpu", save_steps=steps, **options), "when-to-search", "dapo")
    config = grpo_config(hp, "dapo", steps=steps, output_dir=str(out / name), seed=0)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    total = sum(p.numel() for p in policy.parameters())

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[float] = []
            self.save = 0.0
            self.started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.steps.append(time.perf_counter() - self.started)
            self.started = time.perf_counter()

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.save = time.perf_counter() - self.started  # on_step_end ran just before the save

    def paid(prompts: Any, completions: Any, **kw: Any) -> list[float]:
        return list(kw["paid"])

    clock = Clock()
    trainer = HoprlGRPOTrainer(
        model=policy, reward_funcs=[paid], args=config, processing_class=AutoTokenizer.from_pretrained(model),
        train_dataset=Dataset.from_dict({"prompt": ["question one", "question two"]}),
        rollout_func=Replay(rows), callbacks=[clock], peft_config=lora_config(hp),
    )  # fmt: skip
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    micro = config.per_device_train_batch_size
    passes = [rows[i : i + micro] for i in range(0, len(rows), micro)]
    padded = sum(len(p) * max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in p) for p in passes)
    per_token = 6 * total if hp.lora_rank is None else 4 * total + 6 * trainable
    flops = (per_token + (2 * total if config.gradient_checkpointing else 0)) * padded
    rate = matmul_flops(torch.get_num_threads())
    timed = clock.steps[1:] if len(clock.steps) > 1 else clock.steps
    step_s = statistics.median(timed)
    return {
        "variant": name, "steps_s": [round(s, 2) for s in clock.steps], "step_s": round(step_s, 2),
        "save_s": round(clock.save, 2), "peak_rss_gib": round(peak_rss_gib(), 2),
        "params_m": round(total / 1e6, 1), "trainable_m": round(trainable / 1e6, 2),
        "episodes": len(rows), "micro_batch": micro, "padded_tokens": padded,
        "tokens": sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows),
        "step_tflop": round(flops / 1e12, 2), "matmul_gflops": round(rate / 1e9, 1),
        "bound_s": round(flops / rate, 2), "of_bound": round(step_s / (flops / rate), 2),
        "threads": torch.get_num_threads(), "gradient_checkpointing": bool(config.gradient_checkpointing),
        "bf16": bool(config.bf16), "policy_tokens_only": HoprlGRPOTrainer.policy_tokens_only,
    }  # fmt: skip


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--variants", default="full,micro2-nogc,lora16-micro2-nogc,lora16-micro1-nogc")
    parser.add_argument("--steps", type=int, default=3, help="steps per variant (1st: warm-up)")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic world's seed")
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child process's
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a child: one variant, one JSON line
        print("RESULT " + json.dumps(run_variant(args.variant, args.model, args.rows, args.steps, args.work)))
        return
    from hoprl.generation.model import resolve_model

    model = resolve_model(args.model, ROOT / ".hoprl/models/smollm2-135m-instruct")
    results = []
    with tempfile.TemporaryDirectory(prefix="rl-step-") as tmp:
        work = Path(tmp)
        rows = expert_rows(model, work, args.seed)
        (work / "rows.json").write_text(json.dumps(rows))
        for name in args.variants.split(","):
            _, precision = split_variant(name)
            command = [sys.executable, __file__, "--variant", name, "--model", model, "--rows",
                       str(work / "rows.json"), "--steps", str(args.steps), "--work", str(work)]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(ROOT), **precision}
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"variant {name} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(line[len("RESULT ") :]))
            print(json.dumps(results[-1]), flush=True)
    reference = results[0]
    heads = ("variant", "step s", "x ref", "save s", "RSS GiB", "TFLOP", "bound s", "x bound")
    print("\n" + " ".join(f"{h:>9}" for h in heads))
    for r in results:
        cells = (r["variant"], r["step_s"], round(r["step_s"] / reference["step_s"], 2), r["save_s"],
                 r["peak_rss_gib"], r["step_tflop"], r["bound_s"], r["of_bound"])  # fmt: skip
        print(" ".join(f"{c:>9}" for c in cells))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
