"""fp32 against bf16 autocast on this CPU: does mixed precision pay here?

    python bench/precision.py [--threads 1] [--repeats 3]

Times, on the default model (SmolLM2-135M-Instruct), alternating the two precisions so that
machine noise hits both alike:
- a forward + backward pass over 4 x 720 tokens (a GRPO loss batch of multi-turn episodes);
- sampling 64 new tokens for 8 prompts of 300 tokens (a rollout turn).
Prints the medians and the ratio fp32 / bf16. ``hoprl/training/hardware.py`` turns bf16 on where
this benchmark found it faster (CPUs with AMX); ``HOPRL_BF16`` overrides that choice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from hoprl.generation.model import resolve_model
from hoprl.training.hardware import bf16_mixed_precision


def timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=None, help="HF id or folder; default: the bundled SmolLM2-135M")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model, Path(".hoprl/models/smollm2-135m-instruct"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(100, 20_000, (4, 720), generator=gen)
    prompts = torch.randint(100, 20_000, (8, 300), generator=gen)

    def train_pass(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        model.zero_grad()

    def sample(bf16: bool) -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=64,
                           min_new_tokens=64, do_sample=True)  # fmt: skip

    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: None)()
    result: dict[str, Any] = {"threads": args.threads, "amx": amx, "bf16_chosen": bf16_mixed_precision()}
    for name, fn in (("forward+backward 4x720", train_pass), ("sample 8x(300+64)", sample)):
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for _ in range(args.repeats):
            for label, bf16 in (("fp32", False), ("bf16", True)):
                times[label].append(timed(lambda: fn(bf16)))  # noqa: B023
        med = {k: statistics.median(v) for k, v in times.items()}
        result[name] = {"fp32_s": round(med["fp32"], 2), "bf16_s": round(med["bf16"], 2),
                        "fp32/bf16": round(med["fp32"] / med["bf16"], 2)}  # fmt: skip
        print(name, result[name], flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
