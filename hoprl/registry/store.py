"""The run registry: typed reads and writes over the tables of :mod:`hoprl.registry.models`.

Every write that a resumed job may repeat is idempotent: runs, datasets, indexes, stages, stage
switches and checkpoints return the existing row, metrics overwrite, and episodes are inserted
with ``INSERT ... ON CONFLICT DO NOTHING`` on their key (run, step, question, sample), so a job
killed mid-step and resumed never writes an episode twice and never fails on a duplicate, even
with several writers at once.

>>> reg = Registry("sqlite:///.hoprl/registry.db")  # doctest: +SKIP
>>> run = reg.create_run("r1", recipe="when-to-search", objective="grpo", model="smollm2", config={}, seed=0)
>>> reg.log_metrics("r1", step=1, metrics={"reward": 0.2})  # doctest: +SKIP

Methods return ORM rows detached from their session (``expire_on_commit=False``): their columns
are plain attributes to read, and changing them changes nothing in the database.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from hoprl.agent.trajectory import Episode
from hoprl.metrics.stats import BootstrapResult, paired_bootstrap
from hoprl.registry.migrate import migrate
from hoprl.registry.models import (
    RUN_KINDS,
    RUN_STATUSES,
    TERMINAL_STATUSES,
    Base,
    CheckpointRow,
    DatasetRow,
    EpisodeRow,
    EvaluationRow,
    IndexRow,
    MetricRow,
    PredictionRow,
    RunKind,
    RunRow,
    RunStatus,
    StageRow,
    StageSwitchRow,
    utcnow,
)
from hoprl.registry.records import Prediction, current_code_version, total_reward

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///.hoprl/registry.db"

# Per-question scores that ``compare`` can pair; judge verdicts must exist for "judge".
COMPARABLE: dict[str, InstrumentedAttribute[Any]] = {
    "em": PredictionRow.em,
    "f1": PredictionRow.f1,
    "judge": PredictionRow.judge_verdict,
    "refused": PredictionRow.refused,
    "retrieval_count": PredictionRow.retrieval_count,
    "latency": PredictionRow.latency,
}


def _engine(url: str | URL) -> Engine:
    """An engine with foreign keys on and concurrent writers waiting (not failing) on SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"the registry supports postgresql and sqlite URLs, got {parsed.render_as_string()}")
    return create_engine(parsed, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")  # SQLite ignores ON DELETE CASCADE without it
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.close()


class Registry:
    """Typed access to one registry database; opening it upgrades the schema to head.

    Args:
        url: a SQLAlchemy URL (``postgresql+psycopg://user@host/db`` or ``sqlite:///path``);
            default ``$HOPRL_DATABASE_URL``, else ``sqlite:///.hoprl/registry.db``.
    """

    def __init__(self, url: str | URL | None = None) -> None:
        self.url = make_url(url or os.environ.get("HOPRL_DATABASE_URL") or DEFAULT_URL)
        self.engine = _engine(self.url)
        migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    def _insert(self, model: type[Base]) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_nothing`` / ``on_conflict_do_update``."""
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(model)

    # -- datasets and indexes -------------------------------------------------------------------

    def register_dataset(
        self, name: str, source: str, content_hash: str, counts: Mapping[str, int]
    ) -> DatasetRow:
        """Record a prepared dataset; the same (name, content hash) returns the existing row."""
        values = {"name": name, "source": source, "content_hash": content_hash, "counts": dict(counts)}
        with self.session() as s:
            s.execute(self._insert(DatasetRow).values(values).on_conflict_do_nothing())
            query = select(DatasetRow).filter_by(name=name, content_hash=content_hash)
            return s.scalars(query).one()

    def register_index(
        self, collection: str, embedder: str, corpus_hash: str, points: int, dataset_id: int | None = None
    ) -> IndexRow:
        """Record a built collection; the same (collection, embedder, corpus hash) returns the first row."""
        key = {"collection": collection, "embedder": embedder, "corpus_hash": corpus_hash}
        values = {**key, "points": points, "dataset_id": dataset_id}
        with self.session() as s:
            s.execute(self._insert(IndexRow).values(values).on_conflict_do_nothing())
            return s.scalars(select(IndexRow).filter_by(**key)).one()

    # -- runs -----------------------------------------------------------------------------------

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
        ``kind`` is ``job`` for the trainer service's jobs (its queue launches those alone).
        """
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}; valid: {', '.join(RUN_KINDS)}")
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
        with self.session() as s:
            s.execute(self._insert(RunRow).values(values).on_conflict_do_nothing())
            return s.get_one(RunRow, run_id)

    def set_run_status(self, run_id: str, status: RunStatus, error: str | None = None) -> RunRow:
        """Move a run to ``status``; stamps ``started_at`` on the first "running" and
        ``finished_at`` on succeeded / failed / cancelled."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        with self.session() as s:
            run = self._run(s, run_id)
            run.status = status
            run.error = error
            if status == "running" and run.started_at is None:
                run.started_at = utcnow()
            if status in TERMINAL_STATUSES:
                run.finished_at = utcnow()
            return run

    def get_run(self, run_id: str) -> RunRow | None:
        """The run with this id, or None; an id no column can hold (a NUL in it) names no run."""
        if "\x00" in run_id:  # PostgreSQL text cannot hold NUL: the query itself would fail
            return None
        with self.session() as s:
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
        with self.session() as s:
            return list(s.scalars(query))

    @staticmethod
    def _run(s: Session, run_id: str) -> RunRow:
        run = s.get(RunRow, run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r} in the registry; create it with Registry.create_run first")
        return run

    # -- curriculum stages ----------------------------------------------------------------------

    def start_stage(self, run_id: str, name: str, step: int) -> StageRow:
        """Close the open stage at ``step`` and open stage ``name`` there.

        Idempotent: the same call again, or starting the stage the run is already in (a resumed
        job announcing its stage at the resume step), returns the existing stage.
        """
        with self.session() as s:
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
        with self.session() as s:
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
        with self.session() as s:
            return s.scalars(query).one_or_none()

    def stages(self, run_id: str) -> list[StageRow]:
        with self.session() as s:
            return list(
                s.scalars(select(StageRow).filter_by(run_id=run_id).order_by(StageRow.started_at_step))
            )

    def stage_switches(self, run_id: str) -> list[StageSwitchRow]:
        query = select(StageSwitchRow).filter_by(run_id=run_id).order_by(StageSwitchRow.step)
        with self.session() as s:
            return list(s.scalars(query))

    # -- checkpoints and metrics ----------------------------------------------------------------

    def add_checkpoint(
        self, run_id: str, step: int, path: str, metrics: Mapping[str, Any] | None = None
    ) -> CheckpointRow:
        """Record a checkpoint; a second call for the same (run, step) returns the first row."""
        values = {"run_id": run_id, "step": step, "path": path, "metrics": dict(metrics or {})}
        with self.session() as s:
            s.execute(self._insert(CheckpointRow).values(values).on_conflict_do_nothing())
            return s.scalars(select(CheckpointRow).filter_by(run_id=run_id, step=step)).one()

    def latest_checkpoint(self, run_id: str) -> CheckpointRow | None:
        """The checkpoint with the highest step: where a resumed job starts."""
        query = select(CheckpointRow).filter_by(run_id=run_id).order_by(CheckpointRow.step.desc()).limit(1)
        with self.session() as s:
            return s.scalars(query).one_or_none()

    def checkpoints(self, run_id: str) -> list[CheckpointRow]:
        with self.session() as s:
            return list(
                s.scalars(select(CheckpointRow).filter_by(run_id=run_id).order_by(CheckpointRow.step))
            )

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
        with self.session() as s:
            s.execute(stmt, rows)

    def metric_series(self, run_id: str, name: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of one metric, by step."""
        query = (
            select(MetricRow.step, MetricRow.value)
            .filter_by(run_id=run_id, name=name)
            .order_by(MetricRow.step)
        )
        with self.session() as s:
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
        with self.session() as s:
            return {name: value for name, value in s.execute(query.where(MetricRow.run_id == run_id))}

    # -- episodes -------------------------------------------------------------------------------

    def write_episodes(
        self, run_id: str, step: int, episodes: Sequence[Episode], rewards: Sequence[Mapping[str, Any]]
    ) -> int:
        """Insert the step's episodes unless already stored; returns how many were new.

        Args:
            episodes: keyed by their ``question_id`` and ``sample``.
            rewards: one dict per episode with every reward signal (name -> value); the stored
                total is :func:`total_reward` of it.
        """
        if len(episodes) != len(rewards):
            raise ValueError(
                f"got {len(episodes)} episodes but {len(rewards)} reward dicts; pass one per episode"
            )
        if not episodes:
            return 0
        rows = [
            {
                "run_id": run_id,
                "step": step,
                "question_id": ep.question_id,
                "sample": ep.sample,
                "trajectory": ep.model_dump(mode="json"),
                "rewards": dict(r),
                "total_reward": total_reward(r),
            }
            for ep, r in zip(episodes, rewards, strict=True)
        ]
        # One lock order for every writer: two transactions inserting overlapping keys in
        # opposite orders would otherwise deadlock on PostgreSQL's unique index.
        rows.sort(key=lambda row: (row["question_id"], row["sample"]))
        stmt = self._insert(EpisodeRow).on_conflict_do_nothing().returning(EpisodeRow.id)
        with self.session() as s:
            return len(s.execute(stmt, rows).all())

    def count_episodes(self, run_id: str, step: int | None = None) -> int:
        query = select(func.count()).select_from(EpisodeRow).where(EpisodeRow.run_id == run_id)
        if step is not None:
            query = query.where(EpisodeRow.step == step)
        with self.session() as s:
            return s.scalars(query).one()

    def episodes(self, run_id: str, step: int | None = None) -> list[EpisodeRow]:
        """Stored episodes by (step, question, sample); ``Episode.model_validate(row.trajectory)``
        gives back the agent's episode."""
        order = (EpisodeRow.step, EpisodeRow.question_id, EpisodeRow.sample)
        query = select(EpisodeRow).where(EpisodeRow.run_id == run_id).order_by(*order)
        if step is not None:
            query = query.where(EpisodeRow.step == step)
        with self.session() as s:
            return list(s.scalars(query))

    # -- evaluations ----------------------------------------------------------------------------

    def add_evaluation(
        self,
        run_id: str,
        dataset: str,
        split: str,
        metrics: Mapping[str, Any],
        predictions: Sequence[Prediction | Mapping[str, Any]],
        checkpoint: int | None = None,
    ) -> int:
        """Store an evaluation with its per-question predictions; returns the evaluation id.

        Args:
            metrics: the aggregate metrics (EM, F1, judge accuracy, recall, ...) as reported.
            predictions: one per question, as :class:`Prediction` or a dict of its fields.
            checkpoint: id of the evaluated checkpoint (:meth:`add_checkpoint`), if any.
        """
        rows = [Prediction.model_validate(p) for p in predictions]
        with self.session() as s:
            self._run(s, run_id)
            evaluation = EvaluationRow(
                run_id=run_id, checkpoint_id=checkpoint, dataset=dataset, split=split, metrics=dict(metrics)
            )
            s.add(evaluation)
            s.flush()
            s.add_all(PredictionRow(evaluation_id=evaluation.id, **p.model_dump()) for p in rows)
            return evaluation.id

    def get_evaluation(self, evaluation_id: int) -> EvaluationRow | None:
        with self.session() as s:
            return s.get(EvaluationRow, evaluation_id)

    def predictions(self, evaluation_id: int) -> list[PredictionRow]:
        query = (
            select(PredictionRow).filter_by(evaluation_id=evaluation_id).order_by(PredictionRow.question_id)
        )
        with self.session() as s:
            return list(s.scalars(query))

    def compare(
        self,
        evaluation_a: int,
        evaluation_b: int,
        metric: str = "em",
        n_resamples: int = 10_000,
        seed: int = 0,
    ) -> BootstrapResult:
        """Paired bootstrap of ``mean(a) - mean(b)`` over the questions both evaluations scored.

        ``metric`` is a per-question column: one of :data:`COMPARABLE`. Questions only one side
        has are left out (and logged); ``result.n`` is the number of pairs.
        """
        if metric not in COMPARABLE:
            raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(COMPARABLE)}")
        a, b = self._scores(evaluation_a, metric), self._scores(evaluation_b, metric)
        shared = sorted(a.keys() & b.keys())
        if not shared:
            raise ValueError(
                f"evaluations {evaluation_a} and {evaluation_b} share no question ids; "
                "evaluate both on the same questions to compare them"
            )
        if len(shared) < max(len(a), len(b)):
            log.warning(
                "comparing evaluations %s and %s on the %d shared questions of %d and %d",
                evaluation_a,
                evaluation_b,
                len(shared),
                len(a),
                len(b),
            )
        return paired_bootstrap(
            [a[q] for q in shared], [b[q] for q in shared], n_resamples=n_resamples, seed=seed
        )

    def _scores(self, evaluation_id: int, metric: str) -> dict[str, float]:
        query = select(PredictionRow.question_id, COMPARABLE[metric]).filter_by(evaluation_id=evaluation_id)
        with self.session() as s:
            rows = s.execute(query).all()
        missing = [qid for qid, value in rows if value is None]
        if missing:
            raise ValueError(
                f"evaluation {evaluation_id} has no {metric!r} score for {len(missing)} questions "
                f"(e.g. {missing[0]!r}); run the judge on them or compare on 'em' / 'f1'"
            )
        return {qid: float(value) for qid, value in rows}
