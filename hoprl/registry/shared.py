"""The registry a process shares: the one at ``$HOPRL_DATABASE_URL`` as it is now.

One open :class:`Registry` per URL, owner and process (opening one runs the schema migrations).
The URL is read on every call, so a registry opened under one URL never serves another. The flows
and their Celery fan-out open theirs with ``from_environment("flows")``.
"""

from __future__ import annotations

import functools

from hoprl.registry.ownership import Owner
from hoprl.registry.store import Registry
from hoprl.settings import get_settings


@functools.cache
def _open(url: str | None, owner: Owner) -> Registry:
    return Registry(url, owner=owner)


def from_environment(owner: Owner) -> Registry:
    """The registry at ``$HOPRL_DATABASE_URL`` (default: the SQLite file ``.hoprl/registry.db``),
    writing as ``owner``: only that owner's records (see :mod:`hoprl.registry.ownership`)."""
    return _open(get_settings().database_url, owner)


def forget() -> None:
    """Drop the open registries (tests that switch databases)."""
    _open.cache_clear()
