"""The run registry's tables, as SQLAlchemy 2 typed models.

One run (a training or evaluation job) owns its stages, stage switches, checkpoints, metric
series, episodes and evaluations; an evaluation owns its per-question predictions, which is what
:meth:`hoprl.registry.store.Registry.compare` pairs for the bootstrap test. Deleting a run deletes
everything it owns (``ON DELETE CASCADE``).

The same models run on PostgreSQL (deployments, tests) and SQLite (the zero-setup default):
JSON columns are JSONB on PostgreSQL, surrogate keys are BIGINT on PostgreSQL and SQLite's
``INTEGER PRIMARY KEY`` (the rowid, the only type SQLite auto-increments) there. Every constraint
and index has a deterministic name (:data:`NAMING`), so the Alembic migration in
``alembic/versions`` can name them the same way and ``compare_metadata`` finds no differences.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
#: who owns a run: the trainer service (one of its jobs) or a flow (a pipeline run)
RunKind = Literal["job", "pipeline"]
RUN_KINDS: tuple[str, ...] = get_args(RunKind)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """Timezone-aware now; every timestamp in the registry is UTC."""
    return datetime.now(UTC)


def _run_fk() -> Mapped[str]:
    return mapped_column(String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), default=utcnow, nullable=False)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class DatasetRow(Base):
    """A prepared question set; ``counts`` maps split -> number of questions."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("name", "content_hash"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(Text, doc="hub id or local path the questions came from")
    content_hash: Mapped[str] = mapped_column(String(128))
    counts: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = _created()


class IndexRow(Base):
    """A retriever collection built from a corpus with one embedder."""

    __tablename__ = "indexes"
    __table_args__ = (UniqueConstraint("collection", "embedder", "corpus_hash"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    collection: Mapped[str] = mapped_column(String(200))
    embedder: Mapped[str] = mapped_column(String(200))
    corpus_hash: Mapped[str] = mapped_column(String(128))
    dataset_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("datasets.id", ondelete="SET NULL"), nullable=True
    )
    points: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _created()


class RunRow(Base):
    """One run: recipe x objective x model with its full config, seed and code version.

    ``kind`` says who owns it: ``job`` rows are the trainer service's (its queue launches queued
    jobs and resumes running ones), ``pipeline`` rows are a flow's (the trainer never touches them).
    """

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", "status"),
        CheckConstraint("kind IN ('job', 'pipeline')", "kind"),
        Index(None, "status", "created_at"),
        Index(None, "kind", "status"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    recipe: Mapped[str] = mapped_column(String(64))
    objective: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)
    seed: Mapped[int] = mapped_column(Integer)
    code_version: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    kind: Mapped[str] = mapped_column(String(16), server_default="pipeline")
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    prefect_flow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class StageRow(Base):
    """A curriculum stage of a run; the open one (``ended_at_step`` NULL) is the current stage."""

    __tablename__ = "stages"
    __table_args__ = (UniqueConstraint("run_id", "started_at_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    name: Mapped[str] = mapped_column(String(64))
    started_at_step: Mapped[int] = mapped_column(Integer)
    ended_at_step: Mapped[int | None] = mapped_column(Integer, nullable=True)


class StageSwitchRow(Base):
    """Why a run moved from one stage to the next: the reason and the metric that triggered it."""

    __tablename__ = "stage_switches"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    step: Mapped[int] = mapped_column(Integer)
    from_stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    to_stage: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    metric_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    metric_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = _created()


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = _created()


class MetricRow(Base):
    """One point of a metric series; a re-logged (run, step, name) overwrites the value."""

    __tablename__ = "metrics"
    __table_args__ = (
        UniqueConstraint("run_id", "step", "name"),
        Index(None, "run_id", "name", "step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)


class EpisodeRow(Base):
    """One rollout: the :class:`hoprl.domain.Episode` as JSON plus every reward signal.

    Keyed by (run, step, question, sample), so a resumed job that replays a step inserts nothing.
    """

    __tablename__ = "episodes"
    __table_args__ = (UniqueConstraint("run_id", "step", "question_id", "sample"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    step: Mapped[int] = mapped_column(Integer)
    question_id: Mapped[str] = mapped_column(String(256))
    sample: Mapped[int] = mapped_column(Integer)
    trajectory: Mapped[dict[str, Any]] = mapped_column(JSONType)
    rewards: Mapped[dict[str, Any]] = mapped_column(JSONType)
    total_reward: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = _created()


class EvaluationRow(Base):
    """A run (optionally one of its checkpoints) scored on a dataset split."""

    __tablename__ = "evaluations"
    __table_args__ = (Index(None, "run_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = _run_fk()
    checkpoint_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("checkpoints.id", ondelete="SET NULL"), nullable=True
    )
    dataset: Mapped[str] = mapped_column(String(200))
    split: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = _created()


class PredictionRow(Base):
    """One question of an evaluation; ``judge_verdict`` is NULL when no judge was asked."""

    __tablename__ = "predictions"
    __table_args__ = (UniqueConstraint("evaluation_id", "question_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("evaluations.id", ondelete="CASCADE"), nullable=False
    )
    question_id: Mapped[str] = mapped_column(String(256))
    prediction: Mapped[str] = mapped_column(Text)
    refused: Mapped[bool] = mapped_column(Boolean)
    em: Mapped[float] = mapped_column(Float)
    f1: Mapped[float] = mapped_column(Float)
    judge_verdict: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    retrieval_count: Mapped[int] = mapped_column(Integer)
    latency: Mapped[float] = mapped_column(Float, doc="seconds, retrieval + generation")
