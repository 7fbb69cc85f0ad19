"""The run registry: typed reads and writes over the tables of :mod:`hoprl.registry.models`.

:class:`Registry` combines one class per kind of record, each in its own module:

- :mod:`~hoprl.registry.runs`: runs, their statuses and the queue's atomic claim;
- :mod:`~hoprl.registry.progress`: stages, stage switches, checkpoints, metrics;
- :mod:`~hoprl.registry.episodes`: episodes;
- :mod:`~hoprl.registry.evaluations`: evaluations, predictions and their comparison;
- :mod:`~hoprl.registry.catalog`: datasets and indexes;
- :mod:`~hoprl.registry.base`: the engine, sessions and the owner checks
  (:mod:`~hoprl.registry.ownership`: who owns what).

Every write that a resumed job may repeat is idempotent: runs, datasets, indexes, stages, stage
switches and checkpoints return the existing row, metrics overwrite, and episodes are inserted
with ``INSERT ... ON CONFLICT DO NOTHING`` on their key (run, step, question, sample), so a job
killed mid-step and resumed never writes an episode twice and never fails on a duplicate, even
with several writers at once.

Every record has one owner (docs/registry.md): a registry opened with ``owner="trainer"`` or
``owner="flows"`` refuses to write the other's records with
:class:`~hoprl.registry.ownership.OwnershipError`; reads are open to everyone. ``owner=None``
(the default) writes everything: tests, migrations and scripts only.

>>> reg = Registry("sqlite:///.hoprl/registry.db", owner="flows")  # doctest: +SKIP
>>> run = reg.create_run("r1", recipe="when-to-search", objective="grpo", model="smollm2", config={}, seed=0)
>>> reg.log_metrics("r1", step=1, metrics={"reward": 0.2})  # doctest: +SKIP

Methods return ORM rows detached from their session (``expire_on_commit=False``): their columns
are plain attributes to read, and changing them changes nothing in the database.
"""

from __future__ import annotations

from hoprl.registry.base import DEFAULT_URL
from hoprl.registry.catalog import CatalogRecords
from hoprl.registry.episodes import EpisodeRecords
from hoprl.registry.evaluations import COMPARABLE, EvaluationRecords
from hoprl.registry.progress import ProgressRecords
from hoprl.registry.runs import RunRecords

__all__ = ["COMPARABLE", "DEFAULT_URL", "Registry"]


class Registry(RunRecords, ProgressRecords, EpisodeRecords, EvaluationRecords, CatalogRecords):
    """Typed access to one registry database; opening it upgrades the schema to head.

    Args:
        url: a SQLAlchemy URL (``postgresql+psycopg://user@host/db`` or ``sqlite:///path``);
            default ``$HOPRL_DATABASE_URL``, else ``sqlite:///.hoprl/registry.db``.
        owner: ``"trainer"`` or ``"flows"``; None (all) only in tests, migrations and scripts.
    """

    def __enter__(self) -> Registry:
        return self
