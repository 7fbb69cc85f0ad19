"""Registry fixtures: every test runs on a SQLite file and on the real PostgreSQL on 127.0.0.1.

The PostgreSQL parameter creates one fresh database per test session (``hoprl_test_<pid>_<hex>``)
through an AUTOCOMMIT connection to the ``postgres`` database, empties its tables after each test
and drops it at the end. Where no server answers, those parameters skip with the reason.
Set ``HOPRL_TEST_POSTGRES_URL`` (a URL to the server's ``postgres`` database) to use another one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from hoprl.registry import Registry
from hoprl.registry.models import Base

CANDIDATE_ADMIN_URLS = [
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


def _reachable_admin_url() -> tuple[URL | None, str]:
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


@pytest.fixture(scope="session")
def pg_admin_url() -> URL:
    url, errors = _reachable_admin_url()
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


@pytest.fixture(scope="session")
def pg_url(pg_admin_url: URL) -> Iterator[URL]:
    """One fresh database for the whole session, migrated by the first Registry opened on it."""
    with fresh_database(pg_admin_url) as url:
        yield url


def _empty_tables(url: URL) -> None:
    engine = create_engine(url)
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A registry database URL: a new SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        yield make_url(f"sqlite:///{tmp_path / 'registry.db'}")
        return
    url: URL = request.getfixturevalue("pg_url")
    yield url
    _empty_tables(url)


@pytest.fixture
def registry(registry_url: URL) -> Iterator[Registry]:
    with Registry(registry_url) as reg:
        yield reg
