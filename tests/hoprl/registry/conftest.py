"""Registry fixtures: every test runs on a SQLite file and on the real PostgreSQL on 127.0.0.1.

The PostgreSQL parameter creates one fresh database per test session (``hoprl_test_<pid>_<hex>``,
:mod:`tests.postgres`), empties its tables after each test and drops it at the end. Where no
server answers, those parameters skip with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from hoprl.registry import Registry
from hoprl.registry.models import Base
from tests.postgres import admin_url_or_skip, fresh_database

__all__ = ["fresh_database"]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


@pytest.fixture(scope="session")
def pg_admin_url() -> URL:
    return admin_url_or_skip()


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


@pytest.fixture
def postgres_url(pg_url: URL) -> Iterator[URL]:
    """The session's PostgreSQL database, emptied after the test (tests of concurrent writers)."""
    yield pg_url
    _empty_tables(pg_url)
