"""What callers hand the registry, and the values it derives from them."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class Prediction(BaseModel):
    """One scored answer of an evaluation, as :meth:`Registry.add_evaluation` takes it."""

    question_id: str
    prediction: str
    refused: bool = False
    em: float
    f1: float
    judge_verdict: bool | None = None
    retrieval_count: int = 0
    latency: float = Field(default=0.0, description="seconds, retrieval + generation")


def current_code_version() -> str:
    """The git commit of the checkout hoprl runs from, else the installed package version."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return version("hoprl")
    return out.stdout.strip()


def total_reward(rewards: Mapping[str, Any]) -> float:
    """``rewards["total"]`` when the recipe reports it, else the sum of the scalar signals.

    Non-scalar entries (per-step lists, ``None`` for "not applicable") are stored but not summed.
    """
    if "total" in rewards:
        return float(rewards["total"])
    return float(sum(v for v in rewards.values() if isinstance(v, int | float) and not isinstance(v, bool)))
