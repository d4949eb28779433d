"""MemoryStore: the in-memory Store for fast unit tests of other pieces.

Same contract as the databases (the contract tests run against all three) and the same
planner and packing, so what it returns is what a database would return.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from tokenwire.ledger import StepUsage, UsageBy, UsageGroup
from tokenwire.schemas import ErrorEvent, MessageEvent, SessionEvent
from tokenwire.store._backend_rows import SessionState, StepRow, outcome_event, rows_events
from tokenwire.store._commit_plan import StepKey, plan_commit, step_key, validate
from tokenwire.store._errors import StoreUnavailable
from tokenwire.store._records import (
    CommittedStep,
    SessionSummary,
    StepRecord,
    StepRepair,
    StoreStats,
)
from tokenwire.store._repair_plan import RepairPlan, plan_repair, unchanged
from tokenwire.store._usage_rows import group_lines, usage_line, usage_lines


class MemoryStore:
    """A Store in process memory. Nothing survives ``close()``; not shared between objects.

    Every method runs without awaiting, so each call is atomic on the event loop.
    """

    def __init__(self, *, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._sessions: dict[str, SessionState] = {}
        self._rows: dict[str, list[StepRow]] = {}
        self._index: dict[StepKey, StepRow] = {}
        self._lines: dict[StepKey, StepUsage] = {}
        self.repairs: list[RepairPlan] = []
        """The repair log (what ``step_repairs`` holds in a database), oldest first."""
        self._closed = False

    @property
    def url(self) -> str:
        """``memory://``."""
        return "memory://"

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        """See :meth:`Store.commit`."""
        self._check_open()
        for record in records:
            validate(record)
        keys = {step_key(r) for r in records}
        stored = {k: self._index[k].committed(False) for k in keys if k in self._index}
        states = {
            r.session: self._sessions.get(r.session) or SessionState(r.session) for r in records
        }
        plan = plan_commit(records, stored, states, self._clock(), usage_lines(records))
        for row in plan.rows:
            self._rows.setdefault(row.session, []).append(row)
            self._index[(row.session, row.turn, row.step)] = row
        self._sessions.update((s.session, s) for s in plan.sessions)
        self._lines.update(((li.session, li.turn, li.step), li) for li in plan.lines)
        return plan.results

    async def replace_step(self, record: StepRecord) -> StepRepair | None:
        """See :meth:`Store.replace_step`."""
        self._check_open()
        validate(record)
        key = step_key(record)
        row = self._index.get(key)
        if row is None:
            return None
        rows = self._rows[record.session]
        later = [r for r in rows if r.position > row.position]
        plan = plan_repair(
            row,
            record,
            self._sessions[record.session],
            later_steps=len(later),
            line=usage_line(record),
            repaired_ns=self._clock(),
        )
        if plan is None:
            return unchanged(row)
        moved = {
            r.position: msgspec.structs.replace(
                r, seq_start=r.seq_start + plan.shift, seq_end=r.seq_end + plan.shift
            )
            for r in later
        }
        moved[row.position] = plan.row
        rows[:] = [moved.get(r.position, r) for r in rows]
        self._index.update(((r.session, r.turn, r.step), r) for r in rows)
        self._lines[key] = plan.line
        self._sessions[record.session] = msgspec.structs.replace(
            plan.session,
            first_ns=min(r.first_ns for r in rows),
            last_ns=max(r.completed_ns for r in rows),
        )
        self.repairs.append(plan)
        return plan.result

    async def session_events(
        self, session: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[SessionEvent]:
        """See :meth:`Store.session_events`."""
        self._check_open()
        return rows_events(self._rows.get(session, []), from_seq, to_seq)

    async def messages(self, session: str) -> list[MessageEvent | ErrorEvent]:
        """See :meth:`Store.messages`."""
        self._check_open()
        return [outcome_event(row) for row in self._rows.get(session, [])]

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        """See :meth:`Store.step_outcome`."""
        self._check_open()
        row = self._index.get((session, turn, step))
        return None if row is None else outcome_event(row)

    async def sessions(
        self, limit: int = 100, offset: int = 0, *, tenant: str | None = None
    ) -> list[SessionSummary]:
        """See :meth:`Store.sessions`."""
        self._check_open()
        kept = [s for s in self._sessions.values() if tenant is None or s.tenant == tenant]
        ordered = sorted(kept, key=lambda s: (-(s.last_ns or 0), s.session))
        return [s.summary() for s in ordered[offset : offset + limit]]

    async def session(self, session: str) -> SessionSummary | None:
        """See :meth:`Store.session`."""
        self._check_open()
        state = self._sessions.get(session)
        return None if state is None else state.summary()

    async def stats(self) -> StoreStats:
        """See :meth:`Store.stats`."""
        self._check_open()
        states = self._sessions.values()
        return StoreStats(
            sessions=len(states),
            steps=sum(s.steps for s in states),
            messages=sum(s.messages for s in states),
            errors=sum(s.errors for s in states),
            chunks=sum(s.chunks for s in states),
        )

    async def usage(
        self, by: UsageBy, since: str | None = None, tenant: str | None = None
    ) -> list[UsageGroup]:
        """See :meth:`Store.usage`."""
        self._check_open()
        return group_lines(self._lines.values(), by, since, tenant)

    async def session_usage(self, session: str) -> list[StepUsage]:
        """See :meth:`Store.session_usage`."""
        self._check_open()
        keys = [(r.session, r.turn, r.step) for r in self._rows.get(session, [])]
        return [self._lines[k] for k in keys if k in self._lines]

    async def delete_session(self, session: str) -> int:
        """See :meth:`Store.delete_session`."""
        self._check_open()
        rows = self._rows.pop(session, [])
        self._sessions.pop(session, None)
        for row in rows:
            del self._index[(row.session, row.turn, row.step)]
            self._lines.pop((row.session, row.turn, row.step), None)
        self.repairs = [plan for plan in self.repairs if plan.row.session != session]
        return len(rows)

    async def truncate(self) -> None:
        """See :meth:`Store.truncate`."""
        self._check_open()
        self._sessions.clear()
        self.repairs.clear()
        self._rows.clear()
        self._index.clear()
        self._lines.clear()

    async def ping(self) -> None:
        """See :meth:`Store.ping`."""
        self._check_open()

    async def close(self) -> None:
        """See :meth:`Store.close`."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("memory", "the store is closed")
