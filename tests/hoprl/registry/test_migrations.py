"""The Alembic migrations build exactly the schema the models declare, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
from sqlalchemy.exc import IntegrityError

import hoprl.registry
from hoprl.registry import migrate
from hoprl.registry.migrate import alembic_config
from hoprl.registry.models import Base

from .conftest import BACKENDS, fresh_database

pytestmark = pytest.mark.timeout(120)
HEAD = "0003"


@contextmanager
def empty_database(backend: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> Iterator[URL]:
    """An empty database: a new SQLite file, or a new PostgreSQL database dropped afterwards."""
    if backend == "sqlite":
        yield make_url(f"sqlite:///{tmp_path / f'{name}.db'}")
        return
    with fresh_database(request.getfixturevalue("pg_admin_url")) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    with empty_database(request.param, request, tmp_path, "fresh") as url:
        yield url


@pytest.fixture
def models_url(empty_url: URL, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A second empty database of the same backend, created from the models (``create_all``)."""
    with empty_database(empty_url.get_backend_name(), request, tmp_path, "models") as url:
        engine = create_engine(url)
        Base.metadata.create_all(engine)
        engine.dispose()
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


def constraint_names(url: URL) -> dict[str, set[tuple[str, str | None]]]:
    """Every table's named constraints and indexes, as the database reports them: (kind, name)."""
    engine = create_engine(url)
    found: dict[str, set[tuple[str, str | None]]] = {}
    inspector = inspect(engine)
    for table in Base.metadata.tables:
        names = {("pk", inspector.get_pk_constraint(table)["name"])}
        names |= {("uq", c["name"]) for c in inspector.get_unique_constraints(table)}
        names |= {("fk", c["name"]) for c in inspector.get_foreign_keys(table)}
        names |= {("ck", c["name"]) for c in inspector.get_check_constraints(table)}
        names |= {("ix", c["name"]) for c in inspector.get_indexes(table)}
        found[table] = names
    engine.dispose()
    return found


def test_migrated_constraint_names_equal_the_models(empty_url: URL, models_url: URL) -> None:
    """Alembic's comparison ignores constraint names; a later migration that drops a constraint by
    its model name would fail on a database that calls it something else (0001 made
    ``ck_runs_ck_runs_status``; 0003 renames it)."""
    migrate(empty_url)
    migrated, models = constraint_names(empty_url), constraint_names(models_url)
    assert ("ck", "ck_runs_status") in models["runs"]
    assert migrated == models


def test_0003_renames_the_status_check_and_keeps_it(empty_url: URL) -> None:
    """A registry at 0002 keeps its rows, and the renamed check still refuses an unknown status."""
    migrate(empty_url, "0002")
    assert ("ck", "ck_runs_ck_runs_status") in constraint_names(empty_url)["runs"]
    engine = create_engine(empty_url)
    columns = "id, recipe, objective, model, config, seed, code_version, status, created_at, kind"
    row = f"INSERT INTO runs ({columns})"
    values = " VALUES (:id, 'arena', 'grpo', 'm', '{}', 0, 'v', :status, :now, 'job')"
    with engine.begin() as conn:
        conn.execute(text(row + values), {"id": "job-1", "status": "running", "now": datetime.now(UTC)})
    migrate(empty_url)
    assert ("ck", "ck_runs_status") in constraint_names(empty_url)["runs"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id, status FROM runs")).all() == [("job-1", "running")]
    with pytest.raises(IntegrityError, match="ck_runs_status"), engine.begin() as conn:
        conn.execute(text(row + values), {"id": "job-2", "status": "paused", "now": datetime.now(UTC)})
    engine.dispose()


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
