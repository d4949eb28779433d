"""SQLiteStore: the embedded default, stdlib ``sqlite3`` in WAL mode.

One connection, used only from one dedicated thread (a single-worker executor), so the event
loop never blocks on disk and every write is serialised in the process; ``BEGIN IMMEDIATE``
serialises writers across processes, and ``busy_timeout`` bounds how long one waits for the
other before the call fails with :class:`StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from tokenwire.ledger import StepUsage, UsageBy, UsageGroup
from tokenwire.schemas import ErrorEvent, MessageEvent, SessionEvent
from tokenwire.store._backend_rows import (
    SEQ_MAX,
    SESSION_COLUMNS,
    STEP_COLUMNS,
    SessionState,
    outcome_event,
    rows_events,
    session_state,
    step_row,
    step_select,
)
from tokenwire.store._commit_plan import StepKey, plan_commit, step_key, validate
from tokenwire.store._errors import (
    StoreConfigError,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
)
from tokenwire.store._migrations import CREATE_MIGRATIONS_TABLE, load_migrations, pending
from tokenwire.store._records import (
    CommittedStep,
    SessionSummary,
    StepRecord,
    StepRepair,
    StoreStats,
)
from tokenwire.store._repair_plan import (
    counter_values,
    plan_repair,
    repair_sql,
    shift_steps,
    step_values,
    unchanged,
)
from tokenwire.store._usage_rows import (
    LINE_COLUMNS,
    group_query,
    group_rows,
    insert_lines,
    line_from_row,
    line_values,
    rollup_deltas,
    session_lines_sql,
    upsert_rollup,
    usage_lines,
)

T = TypeVar("T")
Synchronous = Literal["NORMAL", "FULL"]

_STEPS = ", ".join(STEP_COLUMNS)
_OUTCOMES = step_select(chunks="X''")  # the outcome without the chunk log
_SESSIONS = ", ".join(SESSION_COLUMNS)
_INSERT_STEP = f"INSERT INTO steps ({_STEPS}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
_UPSERT_SESSION = (
    f"INSERT INTO sessions ({_SESSIONS}) VALUES ({', '.join('?' * len(SESSION_COLUMNS))}) "
    "ON CONFLICT (session) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in SESSION_COLUMNS[1:])
)
_SELECT_RANGE = (
    "SELECT seq_start, seq_end, outcome_kind FROM steps WHERE session = ? AND turn = ? AND step = ?"
)
_INSERT_LINE = insert_lines("?")
_UPSERT_ROLLUP = upsert_rollup("?")
_SESSION_LINES = session_lines_sql("?")
_REPAIR = repair_sql("?", line_columns=LINE_COLUMNS)
_SELECT_STEP = f"SELECT {_STEPS} FROM steps WHERE session = ? AND turn = ? AND step = ?"


class SQLiteStore:
    """A Store in one SQLite file (WAL). See :class:`Store` for the contract.

    ``synchronous="FULL"`` (default) fsyncs the WAL at every commit: a commit that returned
    survives power loss. ``"NORMAL"`` skips that fsync: still safe against a process crash,
    but the last commits may roll back on power loss or an OS crash (then ``tokenwire
    rebuild`` restores them from the broker while it retains them). The file and its folder
    are created on first use; nothing touches the disk before the first call.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_s: float = 5.0,
        clock: Callable[[], int] = time.time_ns,
        url: str | None = None,
    ) -> None:
        self._path = Path(path)
        self._synchronous = synchronous
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._url = url or f"sqlite:///{path}"
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tokenwire-sqlite")
        self._conn: sqlite3.Connection | None = None  # touched only on the executor thread
        self._migrated = False
        self._closed = False

    @property
    def url(self) -> str:
        """The ``sqlite:///`` URL of the file."""
        return self._url

    @property
    def synchronous(self) -> Synchronous:
        """The ``PRAGMA synchronous`` level of the connection."""
        return self._synchronous

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        """See :meth:`Store.commit`."""
        for record in records:
            validate(record)
        if not records:
            return []
        return await self._run(lambda conn: self._commit(conn, records))

    async def replace_step(self, record: StepRecord) -> StepRepair | None:
        """See :meth:`Store.replace_step`."""
        validate(record)
        return await self._run(lambda conn: self._replace(conn, record))

    async def session_events(
        self, session: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[SessionEvent]:
        """See :meth:`Store.session_events`."""
        upper = SEQ_MAX if to_seq is None else to_seq
        sql = (
            f"SELECT {_STEPS} FROM steps WHERE session = ? AND seq_end >= ? AND seq_start <= ?"
            " ORDER BY position"
        )
        params = (session, from_seq - 1, upper)
        return await self._run(
            lambda conn: rows_events(
                [step_row(r) for r in conn.execute(sql, params)], from_seq, to_seq
            )
        )

    async def messages(self, session: str) -> list[MessageEvent | ErrorEvent]:
        """See :meth:`Store.messages`."""
        sql = f"SELECT {_OUTCOMES} FROM steps WHERE session = ? ORDER BY position"
        return await self._run(
            lambda conn: [outcome_event(step_row(r)) for r in conn.execute(sql, (session,))]
        )

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        """See :meth:`Store.step_outcome`."""
        sql = f"SELECT {_OUTCOMES} FROM steps WHERE session = ? AND turn = ? AND step = ?"

        def read(conn: sqlite3.Connection) -> MessageEvent | ErrorEvent | None:
            row = conn.execute(sql, (session, turn, step)).fetchone()
            return None if row is None else outcome_event(step_row(row))

        return await self._run(read)

    async def sessions(
        self, limit: int = 100, offset: int = 0, *, tenant: str | None = None
    ) -> list[SessionSummary]:
        """See :meth:`Store.sessions`."""
        where, params = ("WHERE tenant = ? ", (tenant,)) if tenant is not None else ("", ())
        sql = (
            f"SELECT {_SESSIONS} FROM sessions {where}"
            "ORDER BY last_ns DESC, session LIMIT ? OFFSET ?"
        )
        return await self._run(
            lambda conn: [
                session_state(r).summary() for r in conn.execute(sql, (*params, limit, offset))
            ]
        )

    async def session(self, session: str) -> SessionSummary | None:
        """See :meth:`Store.session`."""
        sql = f"SELECT {_SESSIONS} FROM sessions WHERE session = ?"
        row = await self._run(lambda conn: conn.execute(sql, (session,)).fetchone())
        return None if row is None else session_state(row).summary()

    async def stats(self) -> StoreStats:
        """See :meth:`Store.stats`."""
        sql = (
            "SELECT count(*), coalesce(sum(steps), 0), coalesce(sum(messages), 0),"
            " coalesce(sum(errors), 0), coalesce(sum(chunks), 0) FROM sessions"
        )
        return await self._run(lambda conn: StoreStats(*conn.execute(sql).fetchone()))

    async def usage(
        self, by: UsageBy, since: str | None = None, tenant: str | None = None
    ) -> list[UsageGroup]:
        """See :meth:`Store.usage`."""
        sql, params = group_query(by, since, tenant, "?")
        return await self._run(lambda conn: group_rows(by, conn.execute(sql, params)))

    async def session_usage(self, session: str) -> list[StepUsage]:
        """See :meth:`Store.session_usage`."""
        return await self._run(
            lambda conn: [line_from_row(r) for r in conn.execute(_SESSION_LINES, (session,))]
        )

    async def delete_session(self, session: str) -> int:
        """See :meth:`Store.delete_session`."""

        def delete(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                _take_from_rollup(conn, session)
                count: int = conn.execute(
                    "DELETE FROM steps WHERE session = ?", (session,)
                ).rowcount
                conn.execute("DELETE FROM sessions WHERE session = ?", (session,))
                conn.execute("DELETE FROM step_repairs WHERE session = ?", (session,))
            return count

        return await self._run(delete)

    async def truncate(self) -> None:
        """See :meth:`Store.truncate`."""

        def truncate(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                for table in ("steps", "sessions", "step_usage", "usage_daily", "step_repairs"):
                    conn.execute(f"DELETE FROM {table}")

        await self._run(truncate)

    async def ping(self) -> None:
        """See :meth:`Store.ping`."""
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def migrate(self) -> list[int]:
        """Apply pending migrations now; return the versions THIS call applied.

        Any other call migrates on first use anyway; this is for tests and ``tokenwire``
        tooling that wants to know.
        """
        return await self._run(self._migrate_now, migrate=False)

    async def close(self) -> None:
        """See :meth:`Store.close`."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._disconnect)
        self._executor.shutdown(wait=True)

    # -- on the executor thread ------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, migrate: bool = True) -> T:
        if self._closed:
            raise StoreUnavailable("sqlite", "the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn, migrate)

    def _call(self, fn: Callable[[sqlite3.Connection], T], migrate: bool) -> T:
        try:
            conn = self._connection()
            if migrate and not self._migrated:
                self._migrate_now(conn)
            return fn(conn)
        except sqlite3.Error as exc:
            error = self._translate(exc)
            if isinstance(error, StoreUnavailable):
                self._disconnect()  # a fresh connection next call; cheap for SQLite
            raise error from exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreConfigError(self._url, f"cannot create its folder: {exc}") from exc
            conn = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
            try:
                _enable_wal(conn, self._busy_timeout_s)
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _migrate_now(self, conn: sqlite3.Connection) -> list[int]:
        with _immediate(conn):
            conn.execute(CREATE_MIGRATIONS_TABLE)
            applied = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
            todo = pending(applied, load_migrations("sqlite"), self._url)
            for migration in todo:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (?, ?, ?)",
                    (migration.version, migration.name, self._clock()),
                )
        self._migrated = True
        return [m.version for m in todo]

    def _commit(
        self, conn: sqlite3.Connection, records: Sequence[StepRecord]
    ) -> list[CommittedStep]:
        lines = usage_lines(records)  # priced before the write lock is taken
        with _immediate(conn):
            states = {r.session: _load_state(conn, r.session) for r in records}
            stored = _load_stored(conn, {step_key(r) for r in records})
            plan = plan_commit(records, stored, states, self._clock(), lines)
            conn.executemany(_INSERT_STEP, [row.values() for row in plan.rows])
            conn.executemany(_UPSERT_SESSION, [state.values() for state in plan.sessions])
            conn.executemany(_INSERT_LINE, [line_values(line) for line in plan.lines])
            conn.executemany(_UPSERT_ROLLUP, rollup_deltas(plan.lines))
        return plan.results

    def _replace(self, conn: sqlite3.Connection, record: StepRecord) -> StepRepair | None:
        [line] = usage_lines([record])  # priced before the write lock is taken
        key = step_key(record)
        with _immediate(conn):
            found = conn.execute(_SELECT_STEP, key).fetchone()
            if found is None:
                return None
            row = step_row(found)
            later = conn.execute(_REPAIR.later_steps, (row.session, row.position)).fetchone()[0]
            plan = plan_repair(
                row,
                record,
                _load_state(conn, record.session),
                later_steps=later,
                line=line,
                repaired_ns=self._clock(),
            )
            if plan is None:
                return unchanged(row)
            up_and_down = shift_steps(plan)
            for values in up_and_down[:1]:
                conn.execute(_REPAIR.shift, values)
            conn.execute(_REPAIR.update_step, step_values(plan.row))
            for values in up_and_down[1:]:
                conn.execute(_REPAIR.shift, values)
            _replace_line(conn, key, plan.line)
            conn.execute(_REPAIR.session_counters, counter_values(plan.session))
            conn.execute(_REPAIR.insert_log, plan.log_values())
        return plan.result

    def _translate(self, exc: sqlite3.Error) -> StoreError:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, sqlite3.IntegrityError):
            return StoreIntegrityError(reason)
        if isinstance(exc, sqlite3.OperationalError | sqlite3.InterfaceError):
            return StoreUnavailable("sqlite", reason)
        if isinstance(exc, sqlite3.DatabaseError) and "not a database" in reason:
            return StoreConfigError(self._url, reason)
        return StoreUnavailable("sqlite", reason)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the database's write lock up front (so two writers
    wait on ``busy_timeout`` instead of failing on lock upgrade)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        _rollback(conn)
        raise
    conn.execute("COMMIT")


def _rollback(conn: sqlite3.Connection) -> None:
    # Best effort: when the failure was the connection's own, the caller drops it anyway,
    # and the original error is the one worth raising.
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _take_from_rollup(conn: sqlite3.Connection, session: str) -> None:
    """Remove a session's ledger lines and what they added to the rollup."""
    sql = f"SELECT {', '.join(LINE_COLUMNS)} FROM step_usage WHERE session = ?"
    lines = [line_from_row(r) for r in conn.execute(sql, (session,))]
    conn.executemany(_UPSERT_ROLLUP, rollup_deltas(lines, sign=-1))
    conn.execute("DELETE FROM usage_daily WHERE steps = 0")
    conn.execute("DELETE FROM step_usage WHERE session = ?", (session,))


def _replace_line(conn: sqlite3.Connection, key: StepKey, line: StepUsage) -> None:
    """The step's ledger line becomes ``line``; the rollup moves with it."""
    old = [line_from_row(r) for r in conn.execute(_REPAIR.step_line, key)]
    conn.executemany(_UPSERT_ROLLUP, rollup_deltas(old, sign=-1))
    conn.execute(_REPAIR.delete_line, key)
    conn.execute(_INSERT_LINE, line_values(line))
    conn.executemany(_UPSERT_ROLLUP, rollup_deltas([line]))
    conn.execute("DELETE FROM usage_daily WHERE steps = 0")


def _load_state(conn: sqlite3.Connection, session: str) -> SessionState:
    row = conn.execute(f"SELECT {_SESSIONS} FROM sessions WHERE session = ?", (session,)).fetchone()
    return SessionState(session) if row is None else session_state(row)


def _load_stored(conn: sqlite3.Connection, keys: set[StepKey]) -> dict[StepKey, CommittedStep]:
    stored = {}
    for key in keys:
        row = conn.execute(_SELECT_RANGE, key).fetchone()
        if row is not None:
            stored[key] = CommittedStep(*key, row[0], row[1], row[2], inserted=False)
    return stored


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch to WAL, retrying while another connection holds the lock (bounded).

    Changing the journal mode of a new database needs an exclusive lock, and SQLite answers
    "database is locked" at once, without its busy handler, when another connection is opening
    the same file at that moment (two assemblers starting together).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
