"""The real PostgreSQL on 127.0.0.1 for tests: one fresh database at a time, dropped afterwards.

Used by the registry tests and by every service test that runs on PostgreSQL (the trainer's API
and its fuzzing). Set ``HOPRL_TEST_POSTGRES_URL`` (a URL to the server's ``postgres`` database)
to use another server; where none answers, the tests that need one skip with the reason.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

CANDIDATE_ADMIN_URLS = [
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
]


def reachable_admin_url() -> tuple[URL | None, str]:
    """The first admin URL that accepts a connection, or None with every error seen."""
    env = os.environ.get("HOPRL_TEST_POSTGRES_URL")
    errors = []
    for candidate in [env] if env else CANDIDATE_ADMIN_URLS:
        url = make_url(candidate)
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return url, ""
        except Exception as exc:  # any failure to connect means: skip with the reason
            errors.append(f"{url.render_as_string()}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        finally:
            engine.dispose()
    return None, "; ".join(errors)


def admin_url_or_skip() -> URL:
    url, errors = reachable_admin_url()
    if url is None:
        pytest.skip(f"PostgreSQL is not reachable ({errors})")
    return url


@contextmanager
def fresh_database(admin_url: URL) -> Iterator[URL]:
    """Create an empty database with a unique name, yield its URL, drop it afterwards."""
    name = f"hoprl_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin_url.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
