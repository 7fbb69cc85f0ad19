"""Accelerator settings every TRL config of the trainer shares (SFT, GRPO, DPO).

bf16 mixed precision follows CUDA: on the 2-core CPU where it was measured (AVX512-BF16, no AMX)
autocast made a SmolLM2-135M forward + backward slower, not faster (26 s against 17-20 s for
4 x 720 tokens). Not re-measured on CPUs with AMX.
Activation checkpointing stays at TRL's default (on) on CPU too: without it a GRPO step of 8
multi-turn episodes held 16 GB, too much next to the other services on a 24 GB machine.
"""

from __future__ import annotations

from typing import Any

import torch


def accelerator_args() -> dict[str, Any]:
    """``use_cpu`` / ``bf16`` for a transformers ``TrainingArguments``."""
    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": cuda}
