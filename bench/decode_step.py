"""A rollout's two phases on the engine's shapes: prefill in fp32 or bf16, masked decode steps with
the key/value heads repeated or grouped in the kernel.

    python bench/decode_step.py [--threads 1] [--repeats 5] [--rows 8] [--context 1000]

The continuous batch (:mod:`hoprl.generation.decoding`) prefills each prompt alone on a thread of
its own and decodes one token a row per step over a left-padded cache, on another, each with one
torch thread. This times, on the default model (SmolLM2-135M-Instruct: 9 query heads over 3
key/value heads) and alternating the variants so that machine noise hits them alike:

- *prefill*: one prompt of ``--prompt-tokens`` tokens into an empty cache, its last position's
  logits, in fp32 and under bf16 autocast;
- *decode step*: ``--rows`` rows over ``--context`` cached positions, two of them left-padded (so
  the step passes a mask, as every step of the batch does), one token each: with transformers'
  ``sdpa`` (under a mask it repeats every key/value head to the query heads first) and with
  :data:`hoprl.generation.attention.NAME` (the kernel groups the heads), in fp32 and under bf16
  autocast.

Prints each variant's median seconds, its ratio to the first of its phase, and for the decode
steps the largest logit difference between the two attentions (0: the same computation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from hoprl.generation.attention import kernel_gqa
from hoprl.generation.model import resolve_model


def prefill(model: Any, ids: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        cache = DynamicCache(config=model.config)
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits


def decode_steps(
    model: Any, ids: torch.Tensor, steps: int, grouped: bool, bf16: bool
) -> tuple[float, torch.Tensor]:
    """Prefill the padded rows (untimed), then ``steps`` decode steps; the median step's seconds
    and the steps' logits."""
    rows, context = ids.shape
    mask = torch.ones(rows, context, dtype=torch.long)
    mask[0, : context // 20], mask[-1, : context // 5] = 0, 0  # two rows shorter: left padding
    cache = DynamicCache(config=model.config)
    token = torch.full((rows, 1), 17)
    times, logits = [], []
    with kernel_gqa(model) if grouped else nullcontext(), torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for _ in range(steps):
                mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], dim=1)
                began = time.perf_counter()
                out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - began)
                logits.append(out.logits.float())
    return statistics.median(times), torch.cat(logits)


def medians(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Each variant's median over ``repeats`` rounds, the variants alternated within a round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            times[name].append(run())
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF id or folder; default: the bundled SmolLM2-135M")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the engine's: one a thread)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--steps", type=int, default=6, help="decode steps a round (the median step counts)")
    p.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model, Path(".hoprl/models/smollm2-135m-instruct"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (1, args.prompt_tokens), generator=gen)
    padded = torch.randint(3, vocab, (args.rows, args.context), generator=gen)

    def timed(fn: Callable[[], Any]) -> float:
        began = time.perf_counter()
        fn()
        return time.perf_counter() - began

    pre = medians({label: (lambda bf16=bf16: timed(lambda: prefill(model, prompt, bf16)))
                   for label, bf16 in (("fp32", False), ("bf16", True))}, args.repeats)  # fmt: skip
    logits: dict[str, torch.Tensor] = {}

    def step(name: str, grouped: bool, bf16: bool) -> Callable[[], float]:
        def run() -> float:
            seconds, logits[name] = decode_steps(model, padded, args.steps, grouped, bf16)
            return seconds

        return run

    dec = medians({"fp32 repeated heads": step("fp32 repeated heads", False, False),
                   "fp32 kernel GQA": step("fp32 kernel GQA", True, False),
                   "bf16 repeated heads": step("bf16 repeated heads", False, True),
                   "bf16 kernel GQA": step("bf16 kernel GQA", True, True)}, args.repeats)  # fmt: skip
    differ = (logits["fp32 repeated heads"] - logits["fp32 kernel GQA"]).abs().max().item()
    config = model.config
    result: dict[str, Any] = {
        "threads": args.threads, "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
        f"prefill {args.prompt_tokens} tokens": {k: round(v, 4) for k, v in pre.items()},
        f"decode step {args.rows} rows x {args.context}": {k: round(v, 4) for k, v in dec.items()},
        "max |logit difference| fp32 repeated vs kernel GQA": differ,
    }  # fmt: skip
    print("| phase | variant | median s | x first |\n|---|---|---:|---:|")
    for phase, times in ((f"prefill {args.prompt_tokens} tokens", pre),
                         (f"decode step {args.rows} rows x {args.context}", dec)):  # fmt: skip
        first = next(iter(times.values()))
        for name, seconds in times.items():
            print(f"| {phase} | {name} | {seconds:.4f} | {seconds / first:.2f} |")
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
