"""The runs' status check takes the name the models give it: ``ck_runs_status``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

Migration 0001 named the constraint ``ck_runs_status`` where the naming convention
(``ck_%(table_name)s_%(constraint_name)s``) expects the bare ``status``, so the convention was
applied twice and databases got ``ck_runs_ck_runs_status``. PostgreSQL renames the constraint in
place; SQLite cannot, so batch mode copies the table with the constraint under its new name.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUS = "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')"
OLD, NEW = "ck_runs_ck_runs_status", "ck_runs_status"


def _rename(old: str, new: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE runs RENAME CONSTRAINT "{old}" TO "{new}"')
        return
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f(old), type_="check")
        batch.create_check_constraint(op.f(new), STATUS)


def upgrade() -> None:
    _rename(OLD, NEW)


def downgrade() -> None:
    _rename(NEW, OLD)
