"""Accelerator settings every TRL config of the trainer shares (SFT, GRPO, DPO).

bf16 mixed precision (autocast, fp32 master weights) is on with CUDA and on CPUs with AMX, off
elsewhere; ``HOPRL_BF16=0`` / ``1`` overrides the choice. Measured on SmolLM2-135M, one thread
(``python bench/precision.py``): on a 2-core CPU with AVX512-BF16 but no AMX autocast made a
forward + backward of 4 x 720 tokens slower (26 s against 17-20 s); on a 2-core CPU with AMX it made
it 1.91x faster and sampling 8 x 64 tokens 1.12x faster, beside one other process (2.97x and
1.16x beside two; docs/training.md).
Activation checkpointing stays at TRL's default (on) on CPU too: without it a GRPO step of 8
multi-turn episodes held 16 GB, too much next to the other services on a 24 GB machine.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def bf16_mixed_precision() -> bool:
    """Whether training and rollouts autocast to bf16 here (see the module docstring)."""
    override = os.environ.get("HOPRL_BF16", "").strip().lower()
    if override:
        return override not in ("0", "false", "no", "off")
    if torch.cuda.is_available():
        return True
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private, hence the guard
    return bool(amx is not None and amx())


def accelerator_args() -> dict[str, Any]:
    """``use_cpu`` / ``bf16`` for a transformers ``TrainingArguments``."""
    return {"use_cpu": not torch.cuda.is_available(), "bf16": bf16_mixed_precision()}
