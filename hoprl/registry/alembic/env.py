"""Alembic environment for the run registry; driven by :func:`hoprl.registry.migrate.migrate`.

There is no ``alembic.ini``: the runner passes an open connection in
``config.attributes["connection"]``. The ``alembic`` command line works too, with
``-x url=postgresql+psycopg://...`` (e.g. for ``alembic revision --autogenerate``).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from hoprl.registry.models import Base


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things, so later migrations copy-and-move tables.
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise RuntimeError("no database: call hoprl.registry.migrate(url), or pass -x url=<sqlalchemy url>")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run them against a database")
run_migrations_online()
