"""The Alembic migrations build exactly the schema the models declare, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, MetaData, create_engine, inspect, text
from sqlalchemy.engine import URL, make_url

import hoprl.registry
from hoprl.registry import migrate
from hoprl.registry.migrate import alembic_config
from hoprl.registry.models import Base

from .conftest import BACKENDS, fresh_database

pytestmark = pytest.mark.timeout(120)
HEAD = "0002"


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """An empty database: a new SQLite file, or a new PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield make_url(f"sqlite:///{tmp_path / 'fresh.db'}")
        return
    with fresh_database(request.getfixturevalue("pg_admin_url")) as url:
        yield url


def schema_diff(url: URL, metadata: MetaData = Base.metadata) -> list[Any]:
    engine = create_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    engine.dispose()
    return diff


def current_revision(url: URL) -> str | None:
    engine = create_engine(url)
    with engine.connect() as conn:
        revision = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return revision


def test_scripts_ship_inside_the_package() -> None:
    location = Path(alembic_config().get_main_option("script_location") or "")
    assert location.is_relative_to(Path(hoprl.registry.__file__).parent)
    assert ScriptDirectory.from_config(alembic_config()).get_heads() == [HEAD]


def test_migrated_schema_matches_the_models(empty_url: URL) -> None:
    migrate(empty_url)
    assert current_revision(empty_url) == HEAD
    assert schema_diff(empty_url) == []
    migrate(empty_url)  # at head already: a no-op
    assert current_revision(empty_url) == HEAD


def test_the_comparison_would_see_a_difference(empty_url: URL) -> None:
    """Guard against a vacuous pass: a column the migration lacks shows up as a difference."""
    migrate(empty_url)
    changed = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["runs"].append_column(Column("priority", Integer, nullable=True))
    assert [d[0] for d in schema_diff(empty_url, changed)] == ["add_column"]


def test_downgrade_to_base_and_back(empty_url: URL) -> None:
    migrate(empty_url)
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    migrate(empty_url)
    assert schema_diff(empty_url) == []


def test_0002_classifies_existing_runs_by_their_ids(empty_url: URL) -> None:
    """A registry made at 0001 upgrades in place: the trainer's ``job-`` rows become jobs."""
    migrate(empty_url, "0001")
    engine = create_engine(empty_url)
    row = "INSERT INTO runs (id, recipe, objective, model, config, seed, code_version, status, created_at) "
    with engine.begin() as conn:
        for run_id in ("job-0123abcd", "when-to-search-1a2b", "my-job"):
            conn.execute(text(row + "VALUES (:id, 'arena', 'grpo', 'm', '{}', 0, 'v', 'running', :now)"),
                         {"id": run_id, "now": datetime.now(UTC)})  # fmt: skip
    migrate(empty_url)
    with engine.connect() as conn:
        kinds = dict(conn.execute(text("SELECT id, kind FROM runs")).all())
    engine.dispose()
    assert kinds == {"job-0123abcd": "job", "when-to-search-1a2b": "pipeline", "my-job": "pipeline"}
    assert schema_diff(empty_url) == []


@pytest.mark.integration
def test_concurrent_migrations_on_postgresql(pg_admin_url: URL) -> None:
    """Two processes opening a new registry at once: the advisory lock lets one create it."""
    errors: list[BaseException] = []
    with fresh_database(pg_admin_url) as url:

        def run() -> None:
            try:
                migrate(url)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert schema_diff(url) == []
