"""Upgrade a registry database to the newest schema, with no ``alembic.ini``.

The migration scripts ship inside the package (``hoprl/registry/alembic``), so this works the
same from a checkout and from an installed wheel::

    >>> migrate("sqlite:///.hoprl/registry.db")  # doctest: +SKIP

Two processes opening the same PostgreSQL registry at once (a trainer and a flow) are
serialised by a transaction-scoped advisory lock, so neither sees a half-created schema.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"
# Any constant works; it only has to be the same in every process that migrates this database.
_PG_LOCK_KEY = 0x686F70726C  # "hoprl"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged scripts, bound to ``connection`` if given."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migrate(target: str | URL | Engine, revision: str = "head") -> None:
    """Upgrade the database at ``target`` (a SQLAlchemy URL or engine) to ``revision``."""
    engine = target if isinstance(target, Engine) else create_engine(target)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            command.upgrade(alembic_config(connection), revision)
    finally:
        if engine is not target:
            engine.dispose()
