"""Initial registry schema: datasets, indexes, runs and everything a run owns.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand to match ``hoprl/registry/models.py`` exactly (constraint names follow the
models' naming convention); ``tests/hoprl/registry/test_migrations.py`` checks that they agree.
Types are spelled out here rather than imported, so that this file keeps meaning what it meant
when later migrations change the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def _id() -> sa.Column[int]:
    return sa.Column("id", BIG_ID, nullable=False)


def _run_id(table: str) -> sa.Column[str]:
    fk = sa.ForeignKey("runs.id", ondelete="CASCADE", name=f"fk_{table}_run_id_runs")
    return sa.Column("run_id", sa.String(64), fk, nullable=False)


def _created() -> sa.Column[object]:
    return sa.Column("created_at", TS, nullable=False)


def upgrade() -> None:
    op.create_table(
        "datasets",
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(128), nullable=False),
        sa.Column("counts", JSON, nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_datasets"),
        sa.UniqueConstraint("name", "content_hash", name="uq_datasets_name_content_hash"),
    )
    op.create_table(
        "indexes",
        _id(),
        sa.Column("collection", sa.String(200), nullable=False),
        sa.Column("embedder", sa.String(200), nullable=False),
        sa.Column("corpus_hash", sa.String(128), nullable=False),
        sa.Column(
            "dataset_id",
            BIG_ID,
            sa.ForeignKey("datasets.id", ondelete="SET NULL", name="fk_indexes_dataset_id_datasets"),
            nullable=True,
        ),
        sa.Column("points", sa.Integer(), nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_indexes"),
        sa.UniqueConstraint(
            "collection", "embedder", "corpus_hash", name="uq_indexes_collection_embedder_corpus_hash"
        ),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("recipe", sa.String(64), nullable=False),
        sa.Column("objective", sa.String(64), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("code_version", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _created(),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prefect_flow_run_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name="ck_runs_status"
        ),
    )
    op.create_index("ix_runs_status_created_at", "runs", ["status", "created_at"])
    _create_run_children()
    _create_evaluations()


def _create_run_children() -> None:
    op.create_table(
        "stages",
        _id(),
        _run_id("stages"),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("started_at_step", sa.Integer(), nullable=False),
        sa.Column("ended_at_step", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_stages"),
        sa.UniqueConstraint("run_id", "started_at_step", name="uq_stages_run_id_started_at_step"),
    )
    op.create_table(
        "stage_switches",
        _id(),
        _run_id("stage_switches"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("from_stage", sa.String(64), nullable=True),
        sa.Column("to_stage", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("metric_name", sa.String(128), nullable=True),
        sa.Column("metric_value", sa.Float(), nullable=True),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_stage_switches"),
        sa.UniqueConstraint("run_id", "step", name="uq_stage_switches_run_id_step"),
    )
    op.create_table(
        "checkpoints",
        _id(),
        _run_id("checkpoints"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.UniqueConstraint("run_id", "step", name="uq_checkpoints_run_id_step"),
    )
    op.create_table(
        "metrics",
        _id(),
        _run_id("metrics"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
        sa.UniqueConstraint("run_id", "step", "name", name="uq_metrics_run_id_step_name"),
    )
    op.create_index("ix_metrics_run_id_name_step", "metrics", ["run_id", "name", "step"])
    op.create_table(
        "episodes",
        _id(),
        _run_id("episodes"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.String(256), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("trajectory", JSON, nullable=False),
        sa.Column("rewards", JSON, nullable=False),
        sa.Column("total_reward", sa.Float(), nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_episodes"),
        sa.UniqueConstraint(
            "run_id", "step", "question_id", "sample", name="uq_episodes_run_id_step_question_id_sample"
        ),
    )


def _create_evaluations() -> None:
    op.create_table(
        "evaluations",
        _id(),
        _run_id("evaluations"),
        sa.Column(
            "checkpoint_id",
            BIG_ID,
            sa.ForeignKey(
                "checkpoints.id", ondelete="SET NULL", name="fk_evaluations_checkpoint_id_checkpoints"
            ),
            nullable=True,
        ),
        sa.Column("dataset", sa.String(200), nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
    )
    op.create_index("ix_evaluations_run_id", "evaluations", ["run_id"])
    op.create_table(
        "predictions",
        _id(),
        sa.Column(
            "evaluation_id",
            BIG_ID,
            sa.ForeignKey(
                "evaluations.id", ondelete="CASCADE", name="fk_predictions_evaluation_id_evaluations"
            ),
            nullable=False,
        ),
        sa.Column("question_id", sa.String(256), nullable=False),
        sa.Column("prediction", sa.Text(), nullable=False),
        sa.Column("refused", sa.Boolean(), nullable=False),
        sa.Column("em", sa.Float(), nullable=False),
        sa.Column("f1", sa.Float(), nullable=False),
        sa.Column("judge_verdict", sa.Boolean(), nullable=True),
        sa.Column("retrieval_count", sa.Integer(), nullable=False),
        sa.Column("latency", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_predictions"),
        sa.UniqueConstraint("evaluation_id", "question_id", name="uq_predictions_evaluation_id_question_id"),
    )


def downgrade() -> None:
    for table in ("predictions", "evaluations", "episodes", "metrics", "checkpoints"):
        op.drop_table(table)
    for table in ("stage_switches", "stages", "runs", "indexes", "datasets"):
        op.drop_table(table)
