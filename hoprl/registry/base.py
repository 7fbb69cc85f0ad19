"""The registry's connection: engine, sessions, and the owner checks every write goes through.

:class:`RegistryBase` is what the record modules (:mod:`~hoprl.registry.runs`,
:mod:`~hoprl.registry.progress`, :mod:`~hoprl.registry.episodes`,
:mod:`~hoprl.registry.evaluations`, :mod:`~hoprl.registry.catalog`) build on; callers use
:class:`hoprl.registry.store.Registry`, which combines them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, func, inspect, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

from hoprl.registry.migrate import migrate
from hoprl.registry.models import Base, RunRow
from hoprl.registry.ownership import RUN_OWNER, TABLE_OWNER, Owner, check_owner, validate_owner
from hoprl.settings import get_settings

Row = TypeVar("Row", bound=Base)

DEFAULT_URL = "sqlite:///.hoprl/registry.db"


def _engine(url: str | URL) -> Engine:
    """An engine with foreign keys on and concurrent writers waiting (not failing) on SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"the registry supports postgresql and sqlite URLs, got {parsed.render_as_string()}")
    return create_engine(parsed, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")  # SQLite ignores ON DELETE CASCADE without it
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.close()


class RegistryBase:
    """One registry database, opened by one owner; opening it upgrades the schema to head.

    Args:
        url: a SQLAlchemy URL (``postgresql+psycopg://user@host/db`` or ``sqlite:///path``);
            default ``$HOPRL_DATABASE_URL``, else ``sqlite:///.hoprl/registry.db``.
        owner: ``"trainer"`` or ``"flows"``: writes to another owner's records raise
            :class:`~hoprl.registry.ownership.OwnershipError`; reads are open. ``None`` writes
            everything: for tests, migrations and one-off scripts, never a service or a flow.
    """

    def __init__(self, url: str | URL | None = None, owner: Owner | None = None) -> None:
        validate_owner(owner)
        self.owner = owner
        self.url = make_url(url or get_settings().database_url or DEFAULT_URL)
        self.engine = _engine(self.url)
        migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._checked = sessionmaker(self.engine, expire_on_commit=False)
        if owner is not None:
            event.listen(self._checked, "before_flush", self._check_flush)
            event.listen(self._checked, "do_orm_execute", self._check_statement)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> RegistryBase:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error.

        For reads the typed methods do not cover. On an owned registry its writes are checked
        too: ORM changes and bulk UPDATE / DELETE of another owner's rows raise
        :class:`~hoprl.registry.ownership.OwnershipError`, and INSERT statements are refused
        (insert through the typed methods).
        """
        with self._checked.begin() as session:
            yield session

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """The typed methods' session: they check ownership themselves, with a clearer message."""
        with self._sessions.begin() as session:
            yield session

    def _of_run(self, model: type[Row], run_id: str, order: Any) -> list[Row]:
        """The rows of ``model`` that belong to ``run_id``, in ``order`` (a column)."""
        with self._transaction() as s:
            return list(s.scalars(select(model).filter_by(run_id=run_id).order_by(order)))

    def _insert(self, model: type[Base]) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_nothing`` / ``on_conflict_do_update``."""
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(model)

    @staticmethod
    def _run(s: Session, run_id: str) -> RunRow:
        run = s.get(RunRow, run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r} in the registry; create it with Registry.create_run first")
        return run

    # -- ownership --------------------------------------------------------------------------------

    def _check_table(self, table: str) -> None:
        check_owner(self.owner, table, TABLE_OWNER[table])

    def _check_run(self, s: Session, run_id: str, table: str) -> None:
        """Refuse writing ``table`` rows of run ``run_id`` unless this registry owns the run.

        A run's kind never changes, so checking it in the writing transaction is enough. A run
        that does not exist passes: the foreign key refuses the write as it always did.
        """
        if self.owner is None:
            return
        kind = s.scalar(select(RunRow.kind).where(RunRow.id == run_id))
        if kind is not None:
            check_owner(self.owner, table, RUN_OWNER[kind], f"run {run_id!r}")

    def _check_flush(self, session: Session, _context: Any, _instances: Any) -> None:
        with session.no_autoflush:
            for row in (*session.new, *session.dirty, *session.deleted):
                table = row.__table__.name
                if table in TABLE_OWNER:
                    self._check_table(table)
                if isinstance(row, RunRow):
                    for kind in {row.kind, *inspect(row).attrs.kind.history.deleted}:
                        check_owner(self.owner, table, RUN_OWNER[kind], f"run {row.id!r}")
                elif hasattr(row, "run_id"):
                    self._check_run(session, row.run_id, table)

    def _check_statement(self, state: ORMExecuteState) -> None:
        if not (state.is_insert or state.is_update or state.is_delete):
            return
        statement: Any = state.statement
        table = statement.table.name
        if table in TABLE_OWNER:
            self._check_table(table)
        if state.is_insert:
            raise ValueError(
                f"an owned registry's session() inserts no {table} rows; use the Registry's methods"
            )
        if table == "predictions":
            return
        where = statement.whereclause
        kinds = select(RunRow.kind, func.min(RunRow.id)).group_by(RunRow.kind)
        if table == "runs":
            kinds = kinds if where is None else kinds.where(where)
        else:
            rows = select(statement.table.c.run_id)
            kinds = kinds.where(RunRow.id.in_(rows if where is None else rows.where(where)))
        for kind, run_id in state.session.execute(kinds):
            check_owner(self.owner, table, RUN_OWNER[kind], f"run {run_id!r}")
