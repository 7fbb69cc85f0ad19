"""EVO-RAG's two-stage curriculum: Discovery, then Refinement once the dev returns plateau."""

from __future__ import annotations

import math

from pydantic import ConfigDict, Field

from hoprl.recipes.base import CurriculumState
from hoprl.recipes.evo_rag.config import EvoRagConfig, Stage, SwitchRule


class Curriculum(CurriculumState):
    """Discovery -> Refinement when the EMA of dev returns stops improving on its best.

    Each :meth:`update` is one dev check (the trainer runs one per checkpoint). The first check
    seeds the EMA (and the best EMA) with its dev return. After that::

        ema  = alpha * dev_return + (1 - alpha) * ema
        flat = ema - best < eps          # rule "best" (the paper); "previous": ema - ema_before
        best = max(best, ema)

    ``patience`` flat checks in a row switch the stage, once; a check that is not flat resets the
    count. This is the paper's rule: the running EMA fails to improve on the **best** EMA so far
    by ``eps`` for ``P`` consecutive checks, so a dip followed by a slow recovery below the old
    best counts as a plateau. ``rule="previous"`` (the project's earlier reading, kept as an
    option) compares with the previous check's EMA instead, so any recovery resets the count.
    State is plain data: ``Curriculum.model_validate(c.to_dict())`` resumes it.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    eps: float = 0.01
    patience: int = Field(default=3, ge=1)
    rule: SwitchRule = "best"
    stage: Stage = "discovery"
    ema: float | None = None
    best: float | None = Field(default=None, description="the highest EMA so far")
    flat_checks: int = 0
    checks: int = 0
    switched_at: int | None = Field(default=None, description="the check that switched the stage")

    @classmethod
    def from_config(cls, config: EvoRagConfig) -> Curriculum:
        return cls(
            alpha=config.ema_alpha,
            eps=config.switch_eps,
            patience=config.switch_patience,
            rule=config.switch_rule,
        )

    def update(self, dev_return: float) -> bool:
        """Record one dev return; True exactly when this check switches to Refinement."""
        if not math.isfinite(dev_return):
            raise ValueError(f"dev return must be finite, got {dev_return}")
        self.checks += 1
        if self.ema is None:
            self.ema = self.best = dev_return
            return False
        previous, self.ema = self.ema, self.alpha * dev_return + (1 - self.alpha) * self.ema
        best = previous if self.best is None else self.best  # (a state saved before `best` existed)
        reference = best if self.rule == "best" else previous
        self.best = max(best, self.ema)
        if self.stage == "refinement":
            return False
        self.flat_checks = self.flat_checks + 1 if self.ema - reference < self.eps else 0
        if self.flat_checks < self.patience:
            return False
        self.stage, self.switched_at = "refinement", self.checks
        return True
