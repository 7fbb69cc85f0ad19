"""Runs get a ``kind``: a trainer ``job`` or a flow's ``pipeline`` run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

Both live in ``runs``. Before this column the trainer's queue took every queued run for one of
its jobs, so a pipeline run created (queued) while a trainer service was up could be launched as
a trainer job, whose worker then marked the pipeline run failed. Existing rows are classified by
the id the trainer gives its jobs (``job-<hex>``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="pipeline"))
        batch.create_check_constraint(op.f("ck_runs_kind"), "kind IN ('job', 'pipeline')")
    op.execute("UPDATE runs SET kind = 'job' WHERE id LIKE 'job-%'")
    op.create_index("ix_runs_kind_status", "runs", ["kind", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_kind_status", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_kind"), type_="check")
        batch.drop_column("kind")
