"""The run registry: datasets, indexes, runs and everything a run produces, in SQL.

PostgreSQL in deployments and tests, SQLite (``.hoprl/registry.db``) as the zero-setup default;
the schema is versioned with Alembic migrations that ship inside the package. Every record has
one owner, the trainer or the flows (:mod:`hoprl.registry.ownership`, docs/registry.md).

>>> from hoprl.registry import Registry
>>> with Registry("sqlite:///:memory:") as reg:  # doctest: +SKIP
...     reg.create_run("r1", recipe="arena", objective="grpo", model="smollm2", config={}, seed=0)
"""

from hoprl.registry.migrate import migrate
from hoprl.registry.models import RUN_STATUSES, RunStatus
from hoprl.registry.ownership import OWNERS, Owner, OwnershipError
from hoprl.registry.records import Prediction, current_code_version, total_reward
from hoprl.registry.store import Registry

__all__ = [
    "OWNERS",
    "RUN_STATUSES",
    "Owner",
    "OwnershipError",
    "Prediction",
    "Registry",
    "RunStatus",
    "current_code_version",
    "migrate",
    "total_reward",
]
