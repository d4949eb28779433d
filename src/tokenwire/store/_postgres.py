"""PostgresStore: psycopg 3 async, one connection for writes and one for reads.

A commit is one transaction that locks the rows of its sessions (``SELECT ... FOR UPDATE``,
in session order so two committers never deadlock on each other), reads what is already
stored under that lock, and inserts the new steps. Two assembler processes committing the
same session therefore serialise on the session row, and the idempotency check is exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from psycopg import AsyncCursor

from tokenwire.ledger import StepUsage, UsageBy, UsageGroup
from tokenwire.schemas import ErrorEvent, MessageEvent, SessionEvent
from tokenwire.store._backend_rows import (
    SEQ_MAX,
    SESSION_COLUMNS,
    STEP_COLUMNS,
    SessionState,
    StepRow,
    outcome_event,
    rows_events,
    session_state,
    step_row,
    step_select,
)
from tokenwire.store._commit_plan import plan_commit, step_key, validate
from tokenwire.store._errors import StoreUnavailable
from tokenwire.store._migrations import CREATE_MIGRATIONS_TABLE, load_migrations, pending
from tokenwire.store._pgconn import PgConnection, PgLink
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

# The transaction-scoped advisory lock that serialises migrations (any 64-bit constant
# unique to tokenwire; it is per database, so it also serialises schemas side by side).
_MIGRATION_LOCK = 0x746F6B656E77_01

_STEPS = step_select(outcome="outcome::text")
_OUTCOMES = step_select(outcome="outcome::text", chunks="''::bytea")  # without the chunk log
_SESSIONS = ", ".join(SESSION_COLUMNS)
_INSERT_STEP = (
    f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ("
    + ", ".join("%s::json" if c == "outcome" else "%s" for c in STEP_COLUMNS)
    + ")"
)
_ENSURE_SESSIONS = (
    "INSERT INTO sessions (session) SELECT unnest(%s::text[]) ORDER BY 1 ON CONFLICT DO NOTHING"
)
_LOCK_SESSIONS = (
    f"SELECT {_SESSIONS} FROM sessions WHERE session = ANY(%s) ORDER BY session FOR UPDATE"
)
_UPDATE_SESSION = (
    "UPDATE sessions SET "
    + ", ".join(f"{c} = %s" for c in SESSION_COLUMNS[1:])
    + " WHERE session = %s"
)
_SELECT_RANGES = (
    "SELECT s.session, s.turn, s.step, s.seq_start, s.seq_end, s.outcome_kind FROM steps s"
    " JOIN unnest(%s::text[], %s::bigint[], %s::bigint[]) AS k(session, turn, step)"
    " ON s.session = k.session AND s.turn = k.turn AND s.step = k.step"
)
_INSERT_LINE = insert_lines("%s")
_UPSERT_ROLLUP = upsert_rollup("%s")
_SESSION_LINES = session_lines_sql("%s")
_SESSION_LINES_FOR_DELETE = f"SELECT {', '.join(LINE_COLUMNS)} FROM step_usage WHERE session = %s"
_REPAIR = repair_sql("%s", json_cast="::json", line_columns=LINE_COLUMNS)
_LOCK_SESSION = f"SELECT {_SESSIONS} FROM sessions WHERE session = %s FOR UPDATE"
_SELECT_STEP = f"SELECT {_STEPS} FROM steps WHERE session = %s AND turn = %s AND step = %s"
_STATS = (
    "SELECT count(*), coalesce(sum(steps), 0)::bigint, coalesce(sum(messages), 0)::bigint,"
    " coalesce(sum(errors), 0)::bigint, coalesce(sum(chunks), 0)::bigint FROM sessions"
)


class PostgresStore:
    """A Store in PostgreSQL (tables in the first schema of ``search_path``).

    Nothing connects before the first call; the first call migrates. After a connection
    failure the call raises :class:`StoreUnavailable` and the next call reconnects.
    ``timeout_s`` bounds every call (connect included); ``connect_timeout_s`` the connect.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        url: str | None = None,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 30.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        bounds = {"connect_timeout_s": connect_timeout_s, "timeout_s": timeout_s}
        self._writer = PgLink(conninfo, **bounds)
        self._reader = PgLink(conninfo, **bounds)
        self._url = url or conninfo
        self._clock = clock
        self._migrated = False
        self._closed = False

    @property
    def url(self) -> str:
        """The URL given (password redacted when opened through ``open_store``)."""
        return self._url

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        """See :meth:`Store.commit`."""
        for record in records:
            validate(record)
        if not records:
            return []
        await self._ensure_migrated()
        # Priced off the event loop and before the transaction (its session locks) opens.
        lines = await asyncio.to_thread(usage_lines, records)
        async with self._writer.use() as conn, conn.transaction():
            return await self._commit(conn, records, lines)

    async def replace_step(self, record: StepRecord) -> StepRepair | None:
        """See :meth:`Store.replace_step`."""
        validate(record)
        await self._ensure_migrated()
        [line] = await asyncio.to_thread(usage_lines, [record])  # priced before the lock
        async with self._writer.use() as conn, conn.transaction():
            return await _replace(conn, record, line, self._clock)

    async def session_events(
        self, session: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[SessionEvent]:
        """See :meth:`Store.session_events`."""
        upper = SEQ_MAX if to_seq is None else to_seq
        rows = await self._rows(
            "session = %s AND seq_end >= %s AND seq_start <= %s",
            (session, from_seq - 1, upper),
            columns=_STEPS,
        )
        return rows_events(rows, from_seq, to_seq)

    async def messages(self, session: str) -> list[MessageEvent | ErrorEvent]:
        """See :meth:`Store.messages`."""
        return [outcome_event(row) for row in await self._rows("session = %s", (session,))]

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        """See :meth:`Store.step_outcome`."""
        rows = await self._rows("session = %s AND turn = %s AND step = %s", (session, turn, step))
        return outcome_event(rows[0]) if rows else None

    async def sessions(
        self, limit: int = 100, offset: int = 0, *, tenant: str | None = None
    ) -> list[SessionSummary]:
        """See :meth:`Store.sessions`."""
        where, params = (" WHERE tenant = %s", (tenant,)) if tenant is not None else ("", ())
        sql = (
            f"SELECT {_SESSIONS} FROM sessions{where}"
            " ORDER BY last_ns DESC NULLS LAST, session LIMIT %s OFFSET %s"
        )
        rows = await self._read(sql, (*params, limit, offset))
        return [session_state(row).summary() for row in rows]

    async def session(self, session: str) -> SessionSummary | None:
        """See :meth:`Store.session`."""
        rows = await self._read(f"SELECT {_SESSIONS} FROM sessions WHERE session = %s", (session,))
        return session_state(rows[0]).summary() if rows else None

    async def stats(self) -> StoreStats:
        """See :meth:`Store.stats`."""
        [row] = await self._read(_STATS, ())
        return StoreStats(*msgspec.convert(row, tuple[int, int, int, int, int]))

    async def usage(
        self, by: UsageBy, since: str | None = None, tenant: str | None = None
    ) -> list[UsageGroup]:
        """See :meth:`Store.usage`."""
        sql, params = group_query(by, since, tenant, "%s")
        return group_rows(by, await self._read(sql, params))

    async def session_usage(self, session: str) -> list[StepUsage]:
        """See :meth:`Store.session_usage`."""
        return [line_from_row(row) for row in await self._read(_SESSION_LINES, (session,))]

    async def delete_session(self, session: str) -> int:
        """See :meth:`Store.delete_session`."""
        await self._ensure_migrated()
        async with self._writer.use() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM sessions WHERE session = %s FOR UPDATE", (session,))
            await _take_from_rollup(conn, session)
            cur = await conn.execute("DELETE FROM steps WHERE session = %s", (session,))
            await conn.execute("DELETE FROM sessions WHERE session = %s", (session,))
            await conn.execute("DELETE FROM step_repairs WHERE session = %s", (session,))
            return cur.rowcount

    async def truncate(self) -> None:
        """See :meth:`Store.truncate`."""
        await self._ensure_migrated()
        async with self._writer.use() as conn:
            await conn.execute("TRUNCATE steps, sessions, step_usage, usage_daily, step_repairs")

    async def ping(self) -> None:
        """See :meth:`Store.ping`."""
        await self._read("SELECT 1", ())

    async def migrate(self) -> list[int]:
        """Apply pending migrations now; return the versions THIS call applied."""
        if self._closed:
            raise StoreUnavailable("postgresql", "the store is closed")
        async with self._writer.use() as conn:
            applied = await self._migrate_now(conn)
        self._migrated = True
        return applied

    async def close(self) -> None:
        """See :meth:`Store.close`."""
        self._closed = True
        await self._writer.discard()
        await self._reader.discard()

    async def _ensure_migrated(self) -> None:
        if self._closed:
            raise StoreUnavailable("postgresql", "the store is closed")
        if not self._migrated:
            await self.migrate()

    async def _read(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        await self._ensure_migrated()
        async with self._reader.use() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def _rows(
        self, where: str, params: tuple[object, ...], columns: str = _OUTCOMES
    ) -> list[StepRow]:
        sql = f"SELECT {columns} FROM steps WHERE {where} ORDER BY position"
        return [step_row(row) for row in await self._read(sql, params)]

    async def _migrate_now(self, conn: PgConnection) -> list[int]:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(CREATE_MIGRATIONS_TABLE)
            cur = await conn.execute("SELECT version FROM schema_migrations")
            todo = pending(
                {v for (v,) in await cur.fetchall()}, load_migrations("postgres"), self._url
            )
            for migration in todo:
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, self._clock()),
                )
        return [m.version for m in todo]

    async def _commit(
        self, conn: PgConnection, records: Sequence[StepRecord], lines: list[StepUsage]
    ) -> list[CommittedStep]:
        names = sorted({r.session for r in records})
        async with conn.cursor() as cur:
            await cur.execute(_ENSURE_SESSIONS, (names,))
            await cur.execute(_LOCK_SESSIONS, (names,))
            states = {row[0]: session_state(row) for row in await cur.fetchall()}
            keys = sorted({step_key(r) for r in records})
            await cur.execute(
                _SELECT_RANGES, tuple(list(column) for column in zip(*keys, strict=True))
            )
            stored = {
                (s, t, st): CommittedStep(s, t, st, a, b, kind, inserted=False)
                for s, t, st, a, b, kind in await cur.fetchall()
            }
            plan = plan_commit(records, stored, states, self._clock(), lines)
            if plan.rows:
                await cur.executemany(_INSERT_STEP, [row.values() for row in plan.rows])
            if plan.sessions:
                await cur.executemany(_UPDATE_SESSION, [_session_params(s) for s in plan.sessions])
            if plan.lines:
                await cur.executemany(_INSERT_LINE, [line_values(line) for line in plan.lines])
                await cur.executemany(_UPSERT_ROLLUP, rollup_deltas(plan.lines))
        return plan.results


async def _replace(
    conn: PgConnection, record: StepRecord, line: StepUsage, clock: Callable[[], int]
) -> StepRepair | None:
    """One repair inside the caller's transaction (see ``_repair_plan``): the session row is
    locked first, as a commit locks it, so a commit of the same session waits for it."""
    key = step_key(record)
    async with conn.cursor() as cur:
        await cur.execute(_LOCK_SESSION, (record.session,))
        state = await cur.fetchone()
        await cur.execute(_SELECT_STEP, key)
        found = await cur.fetchone()
        if state is None or found is None:
            return None
        row = step_row(found)
        await cur.execute(_REPAIR.later_steps, (row.session, row.position))
        (later,) = msgspec.convert(await cur.fetchone(), tuple[int])
        plan = plan_repair(
            row, record, session_state(state), later_steps=later, line=line, repaired_ns=clock()
        )
        if plan is None:
            return unchanged(row)
        up_and_down = shift_steps(plan)
        for values in up_and_down[:1]:
            await cur.execute(_REPAIR.shift, values)
        await cur.execute(_REPAIR.update_step, step_values(plan.row))
        for values in up_and_down[1:]:
            await cur.execute(_REPAIR.shift, values)
        await cur.execute(_REPAIR.step_line, key)
        old = [line_from_row(r) for r in await cur.fetchall()]
        await _move_rollup(cur, old, sign=-1)
        await cur.execute(_REPAIR.delete_line, key)
        await cur.execute(_INSERT_LINE, line_values(plan.line))
        await _move_rollup(cur, [plan.line], sign=1)
        await cur.execute("DELETE FROM usage_daily WHERE steps = 0")
        await cur.execute(_REPAIR.session_counters, counter_values(plan.session))
        await cur.execute(_REPAIR.insert_log, plan.log_values())
    return plan.result


async def _move_rollup(
    cur: AsyncCursor[tuple[Any, ...]], lines: list[StepUsage], *, sign: int
) -> None:
    deltas = rollup_deltas(lines, sign=sign)
    if deltas:
        await cur.executemany(_UPSERT_ROLLUP, deltas)


async def _take_from_rollup(conn: PgConnection, session: str) -> None:
    """Remove a session's ledger lines and what they added to the rollup."""
    cur = await conn.execute(_SESSION_LINES_FOR_DELETE, (session,))
    lines = [line_from_row(row) for row in await cur.fetchall()]
    deltas = rollup_deltas(lines, sign=-1)
    if deltas:
        async with conn.cursor() as write:
            await write.executemany(_UPSERT_ROLLUP, deltas)
        await conn.execute("DELETE FROM usage_daily WHERE steps = 0")
    await conn.execute("DELETE FROM step_usage WHERE session = %s", (session,))


def _session_params(state: SessionState) -> tuple[object, ...]:
    values = state.values()
    return (*values[1:], values[0])
