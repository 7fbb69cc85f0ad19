"""The registry a process shares: the one at ``$HOPRL_DATABASE_URL`` as it is now.

One open :class:`Registry` per URL and process (opening one runs the schema migrations). The URL
is read on every call, so a registry opened under one URL never serves another.
"""

from __future__ import annotations

import functools
import os

from hoprl.registry.store import Registry


@functools.cache
def _open(url: str | None) -> Registry:
    return Registry(url)


def from_environment() -> Registry:
    """The registry at ``$HOPRL_DATABASE_URL`` (default: the SQLite file ``.hoprl/registry.db``)."""
    return _open(os.environ.get("HOPRL_DATABASE_URL"))


def forget() -> None:
    """Drop the open registries (tests that switch databases)."""
    _open.cache_clear()
