"""What a run records as it trains: curriculum stages, stage switches, checkpoints, metrics.

Each of these rows belongs to its run's owner (a job's: the trainer; a pipeline's: the flows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from hoprl.registry.base import RegistryBase
from hoprl.registry.models import CheckpointRow, MetricRow, StageRow, StageSwitchRow


class ProgressRecords(RegistryBase):
    # -- curriculum stages ----------------------------------------------------------------------

    def start_stage(self, run_id: str, name: str, step: int) -> StageRow:
        """Close the open stage at ``step`` and open stage ``name`` there.

        Idempotent: the same call again, or starting the stage the run is already in (a resumed
        job announcing its stage at the resume step), returns the existing stage.
        """
        with self._transaction() as s:
            self._check_run(s, run_id, "stages")
            return self._start_stage(s, run_id, name, step)

    def _start_stage(self, s: Session, run_id: str, name: str, step: int) -> StageRow:
        existing = s.scalars(select(StageRow).filter_by(run_id=run_id, started_at_step=step)).one_or_none()
        if existing is not None:
            if existing.name != name:
                raise ValueError(
                    f"run {run_id!r} already started stage {existing.name!r} at step {step}; "
                    f"a second stage ({name!r}) cannot start at the same step"
                )
            return existing
        self._run(s, run_id)
        open_stages = (StageRow.run_id == run_id, StageRow.ended_at_step.is_(None))
        current = s.scalars(select(StageRow).where(*open_stages)).first()
        if current is not None and current.name == name:
            return current  # a resumed job re-announcing the stage it is in
        s.execute(update(StageRow).where(*open_stages).values(ended_at_step=step))
        stage = StageRow(run_id=run_id, name=name, started_at_step=step)
        s.add(stage)
        s.flush()
        return stage

    def record_stage_switch(
        self,
        run_id: str,
        step: int,
        from_stage: str | None,
        to_stage: str,
        reason: str,
        metric_name: str | None = None,
        metric_value: float | None = None,
    ) -> StageSwitchRow:
        """Record why the run switched stage at ``step`` and start ``to_stage`` (idempotent per step).

        Example: ``record_stage_switch(run, 120, "discovery", "refinement",
        reason="dev return EMA improved < 0.01 for 3 checks", metric_name="dev_return_ema",
        metric_value=0.412)``.
        """
        values = {
            "run_id": run_id,
            "step": step,
            "from_stage": from_stage,
            "to_stage": to_stage,
            "reason": reason,
            "metric_name": metric_name,
            "metric_value": metric_value,
        }
        with self._transaction() as s:
            self._check_run(s, run_id, "stage_switches")
            self._start_stage(s, run_id, to_stage, step)
            s.execute(self._insert(StageSwitchRow).values(values).on_conflict_do_nothing())
            return s.scalars(select(StageSwitchRow).filter_by(run_id=run_id, step=step)).one()

    def current_stage(self, run_id: str) -> str | None:
        """Name of the run's open stage, or None before its first stage."""
        query = (
            select(StageRow.name)
            .filter_by(run_id=run_id, ended_at_step=None)
            .order_by(StageRow.started_at_step.desc())
            .limit(1)
        )
        with self._transaction() as s:
            return s.scalars(query).one_or_none()

    def stages(self, run_id: str) -> list[StageRow]:
        return self._of_run(StageRow, run_id, StageRow.started_at_step)

    def stage_switches(self, run_id: str) -> list[StageSwitchRow]:
        return self._of_run(StageSwitchRow, run_id, StageSwitchRow.step)

    # -- checkpoints and metrics ----------------------------------------------------------------

    def add_checkpoint(
        self, run_id: str, step: int, path: str, metrics: Mapping[str, Any] | None = None
    ) -> CheckpointRow:
        """Record a checkpoint; a second call for the same (run, step) returns the first row."""
        values = {"run_id": run_id, "step": step, "path": path, "metrics": dict(metrics or {})}
        with self._transaction() as s:
            self._check_run(s, run_id, "checkpoints")
            s.execute(self._insert(CheckpointRow).values(values).on_conflict_do_nothing())
            return s.scalars(select(CheckpointRow).filter_by(run_id=run_id, step=step)).one()

    def latest_checkpoint(self, run_id: str) -> CheckpointRow | None:
        """The checkpoint with the highest step: where a resumed job starts."""
        query = select(CheckpointRow).filter_by(run_id=run_id).order_by(CheckpointRow.step.desc()).limit(1)
        with self._transaction() as s:
            return s.scalars(query).one_or_none()

    def checkpoints(self, run_id: str) -> list[CheckpointRow]:
        return self._of_run(CheckpointRow, run_id, CheckpointRow.step)

    def log_metrics(self, run_id: str, step: int, metrics: Mapping[str, float]) -> None:
        """Upsert one value per metric name at ``step``; re-logging a step overwrites it."""
        if not metrics:
            return
        rows = [
            {"run_id": run_id, "step": step, "name": k, "value": float(metrics[k])} for k in sorted(metrics)
        ]
        stmt = self._insert(MetricRow)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "step", "name"], set_={"value": stmt.excluded.value}
        )
        with self._transaction() as s:
            self._check_run(s, run_id, "metrics")
            s.execute(stmt, rows)

    def metric_series(self, run_id: str, name: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of one metric, by step."""
        query = (
            select(MetricRow.step, MetricRow.value)
            .filter_by(run_id=run_id, name=name)
            .order_by(MetricRow.step)
        )
        with self._transaction() as s:
            return [(step, value) for step, value in s.execute(query)]

    def latest_metrics(self, run_id: str) -> dict[str, float]:
        """Every metric's value at the highest step it was logged."""
        latest = (
            select(MetricRow.name, func.max(MetricRow.step).label("step"))
            .where(MetricRow.run_id == run_id)
            .group_by(MetricRow.name)
            .subquery()
        )
        query = select(MetricRow.name, MetricRow.value).join(
            latest, (MetricRow.name == latest.c.name) & (MetricRow.step == latest.c.step)
        )
        with self._transaction() as s:
            return {name: value for name, value in s.execute(query.where(MetricRow.run_id == run_id))}
