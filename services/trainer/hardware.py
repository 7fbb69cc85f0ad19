"""Accelerator settings every TRL config of the trainer shares (SFT, GRPO, DPO).

TRL turns activation checkpointing on by default: right on a GPU, where memory bounds the batch,
but on a CPU the memory is plentiful for the models it can train in useful time and the
recomputation is pure cost (a third more compute per step). So it is on with CUDA and off
without; bf16 mixed precision likewise follows CUDA.
"""

from __future__ import annotations

from typing import Any

import torch


def accelerator_args() -> dict[str, Any]:
    """``use_cpu`` / ``bf16`` / ``activation_checkpointing`` for a transformers ``TrainingArguments``."""
    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": cuda, "activation_checkpointing": cuda}
