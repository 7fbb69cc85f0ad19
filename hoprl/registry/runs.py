"""Runs: create, move through their statuses, claim from the queue, read.

A run's ``kind`` names its owner (``job``: the trainer, ``pipeline``: the flows) and never
changes; an owned registry creates and moves only its own kind.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import func, select, update

from hoprl.registry.base import RegistryBase
from hoprl.registry.models import (
    RUN_KINDS,
    RUN_STATUSES,
    TERMINAL_STATUSES,
    RunKind,
    RunRow,
    RunStatus,
    utcnow,
)
from hoprl.registry.ownership import OWNED_KIND, RUN_OWNER, check_owner
from hoprl.registry.records import current_code_version


class RunRecords(RegistryBase):
    def create_run(
        self,
        run_id: str,
        recipe: str,
        objective: str,
        model: str,
        config: Mapping[str, Any],
        seed: int,
        code_version: str | None = None,
        prefect_flow_run_id: str | None = None,
        kind: RunKind = "pipeline",
    ) -> RunRow:
        """Create a queued run, or return the run that already has this id (unchanged).

        ``code_version`` defaults to :func:`current_code_version` (git sha, else the package version).
        ``kind`` is ``job`` for the trainer service's jobs (its queue launches those alone). On
        an owned registry, an existing run of the other kind with this id is refused, not returned.
        """
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}; valid: {', '.join(RUN_KINDS)}")
        check_owner(self.owner, "runs", RUN_OWNER[kind], f"kind {kind!r}")
        values = {
            "id": run_id,
            "recipe": recipe,
            "objective": objective,
            "model": model,
            "config": dict(config),
            "seed": seed,
            "code_version": code_version or current_code_version(),
            "status": "queued",
            "prefect_flow_run_id": prefect_flow_run_id,
            "kind": kind,
        }
        with self._transaction() as s:
            s.execute(self._insert(RunRow).values(values).on_conflict_do_nothing())
            run = s.get_one(RunRow, run_id)
            check_owner(self.owner, "runs", RUN_OWNER[run.kind], f"run {run_id!r}")
            return run

    def set_run_status(self, run_id: str, status: RunStatus, error: str | None = None) -> RunRow:
        """Move a run to ``status``; stamps ``started_at`` on the first "running" and
        ``finished_at`` on succeeded / failed / cancelled."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        with self._transaction() as s:
            run = self._run(s, run_id)
            check_owner(self.owner, "runs", RUN_OWNER[run.kind], f"run {run_id!r}")
            run.status = status
            run.error = error
            if status == "running" and run.started_at is None:
                run.started_at = utcnow()
            if status in TERMINAL_STATUSES:
                run.finished_at = utcnow()
            return run

    def claim_run(self, run_id: str) -> RunRow | None:
        """Move run ``run_id`` from ``queued`` to ``running`` if it is still queued; None if not.

        Of two claimers at once exactly one gets the run (:meth:`transition_run`); ``get_run``
        then ``set_run_status`` is not a claim: both claimers read "queued".
        """
        queued: tuple[RunStatus, ...] = ("queued",)
        return self.transition_run(run_id, "running", queued)

    def transition_run(
        self, run_id: str, status: RunStatus, only_from: Collection[RunStatus], error: str | None = None
    ) -> RunRow | None:
        """Move a run to ``status`` only if its status is one of ``only_from``, else return None.

        One conditional UPDATE: on PostgreSQL a second writer waits for the first's row lock,
        then re-reads the status, so a status written in between is never overwritten (e.g. a
        cancel ``transition_run(id, "cancelled", ("queued", "running"))`` after the worker
        recorded "succeeded" changes nothing). Stamps like :meth:`set_run_status`.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        values: dict[str, Any] = {"status": status, "error": error}
        if status == "running":
            values["started_at"] = func.coalesce(RunRow.started_at, utcnow())
        if status in TERMINAL_STATUSES:
            values["finished_at"] = utcnow()
        with self._transaction() as s:
            kind = s.scalar(select(RunRow.kind).where(RunRow.id == run_id))
            if kind is None:
                return None
            check_owner(self.owner, "runs", RUN_OWNER[kind], f"run {run_id!r}")
            moved = (
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.status.in_(list(only_from)))
                .values(values)
                .returning(RunRow.id)
            )
            if s.execute(moved).first() is None:
                return None
            return s.get_one(RunRow, run_id, populate_existing=True)

    def claim_next(self, kind: RunKind | None = None) -> RunRow | None:
        """Claim the oldest queued run of ``kind`` (default: this registry's own kind); None if none.

        What a queue should call instead of listing queued runs and setting one running.
        """
        kind = kind or (OWNED_KIND[self.owner] if self.owner else "job")
        query = (
            select(RunRow.id)
            .where(RunRow.status == "queued", RunRow.kind == kind)
            .order_by(RunRow.created_at, RunRow.id)
            .limit(1)
        )
        while True:
            with self._transaction() as s:
                run_id = s.scalar(query)
            if run_id is None:
                return None
            claimed = self.claim_run(run_id)
            if claimed is not None:
                return claimed  # else another claimer took it first: try the next one

    def get_run(self, run_id: str) -> RunRow | None:
        """The run with this id, or None; an id no column can hold (a NUL in it) names no run."""
        if "\x00" in run_id:  # PostgreSQL text cannot hold NUL: the query itself would fail
            return None
        with self._transaction() as s:
            return s.get(RunRow, run_id)

    def list_runs(
        self,
        status: RunStatus | None = None,
        recipe: str | None = None,
        limit: int = 100,
        kind: RunKind | None = None,
    ) -> list[RunRow]:
        """Runs, newest first, optionally filtered by status, recipe and kind."""
        query = select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id).limit(limit)
        if status is not None:
            query = query.where(RunRow.status == status)
        if kind is not None:
            query = query.where(RunRow.kind == kind)
        if recipe is not None:
            query = query.where(RunRow.recipe == recipe)
        with self._transaction() as s:
            return list(s.scalars(query))
