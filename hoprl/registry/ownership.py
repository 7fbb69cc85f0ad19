"""Who may write which registry record: one owner per record, reads open to everyone.

Two components write the registry, each its own records (docs/registry.md has the table and the
call sites it was derived from):

- ``trainer``: the trainer service, its job workers and ``bench/train.py``. It owns the runs of
  kind ``job`` and everything recorded under them: status, stages, stage switches, checkpoints,
  metrics, episodes.
- ``flows``: the Prefect flows and their Celery fan-out units. They own the runs of kind
  ``pipeline`` and everything under them (including evaluations and their predictions), and the
  datasets and indexes.

A run's ``kind`` is set when it is created and never changes, so the owner of every row under a
run is known from the run alone. A :class:`~hoprl.registry.store.Registry` opened with
``owner=None`` writes everything: that is for tests, migrations and one-off scripts only; every
production opener names its owner.
"""

from __future__ import annotations

from typing import Literal, get_args

from hoprl.registry.models import RunKind

Owner = Literal["trainer", "flows"]
OWNERS: tuple[str, ...] = get_args(Owner)

#: the owner of a run (and of every row under it), by the run's kind
RUN_OWNER: dict[str, Owner] = {"job": "trainer", "pipeline": "flows"}
#: the kind of the runs each owner creates
OWNED_KIND: dict[Owner, RunKind] = {"trainer": "job", "flows": "pipeline"}
#: tables with one owner whatever they refer to (the rest take the owner of their run)
TABLE_OWNER: dict[str, Owner] = {
    "datasets": "flows",
    "indexes": "flows",
    "evaluations": "flows",
    "predictions": "flows",
}


class OwnershipError(RuntimeError):
    """A write to a record that another component owns.

    Attributes: ``table``, the table written; ``writer``, the registry's owner; ``owner``, the
    record's owner.
    """

    def __init__(self, table: str, writer: str, owner: str, record: str = "") -> None:
        self.table, self.writer, self.owner = table, writer, owner
        what = f"{table} of {record}" if record else table
        super().__init__(
            f"the {writer} cannot write {what}: those records belong to the {owner} "
            f"(a Registry opened with owner={writer!r} writes only its own; see docs/registry.md)"
        )


def check_owner(owner: str | None, table: str, record_owner: str, record: str = "") -> None:
    """Raise :class:`OwnershipError` unless ``owner`` (None = everyone) may write the record."""
    if owner is not None and owner != record_owner:
        raise OwnershipError(table, owner, record_owner, record)


def validate_owner(owner: str | None) -> None:
    if owner is not None and owner not in OWNERS:
        raise ValueError(f"unknown registry owner {owner!r}; valid: {', '.join(OWNERS)} (or None for all)")
