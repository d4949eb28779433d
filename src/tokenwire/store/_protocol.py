"""The Store seam: one Protocol, implemented by SQLite, PostgreSQL and memory side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenwire.ledger import StepUsage, UsageBy, UsageGroup
from tokenwire.schemas import ErrorEvent, MessageEvent, SessionEvent
from tokenwire.store._records import (
    CommittedStep,
    SessionSummary,
    StepRecord,
    StepRepair,
    StoreStats,
)


class Store(Protocol):
    """The durable store of session events: a projection of the broker's chunk stream.

    Every method may raise :class:`StoreUnavailable` (retry later, the same object recovers)
    and :class:`StoreIntegrityError`. Example::

        store = open_store("sqlite:///./.tokenwire/store.db")
        try:
            [done] = await store.commit([record])
            events = await store.session_events(record.session, from_seq=done.seq_start)
        finally:
            await store.close()
    """

    @property
    def url(self) -> str:
        """The store URL, password redacted (for status displays and logs)."""
        ...

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        """Store the steps in ONE transaction; return one result per record, in order.

        Seq ranges are assigned per session in batch order, contiguous from the session's
        last seq + 1 (a step without chunks gets ``seq_end == seq_start - 1``). Idempotent: a
        (session, turn, step) already stored, or earlier in the same batch, is not written
        again and returns its stored range with ``inserted=False``. When the commit raises,
        nothing of the batch was written (or, if the connection died during COMMIT, all of
        it may have been: commit again to learn which).
        """
        ...

    async def replace_step(self, record: StepRecord) -> StepRepair | None:
        """Rewrite a stored step with ``record``, in ONE transaction: the repair of a step
        stored wrong (``tokenwire rebuild --repair``).

        Its outcome, chunk log and ledger line are replaced (the rollup moves with the line),
        its position and ``seq_start`` kept; when its chunk count changes, the session's later
        steps move by the difference, so the seqs stay contiguous and every outcome cites its
        own chunks; the session's counters follow. One row of the repair log (``step_repairs``)
        keeps what the step held before. A row already holding the record's outcome and chunk
        log is left as it is (``replaced=False``); a step not stored returns None.
        """
        ...

    async def session_events(
        self, session: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[SessionEvent]:
        """The session's events with seq in ``[from_seq, to_seq]``, in seq order.

        Chunk events are expanded from the packed rows; each step's message or error event
        follows the step's last chunk and is included when that chunk is in the range (a
        step without chunks: when its ``seq_start`` is). Unknown session: ``[]``.
        """
        ...

    async def messages(self, session: str) -> list[MessageEvent | ErrorEvent]:
        """Every step outcome of the session, in seq order."""
        ...

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        """The outcome of one step, or None when it is not stored."""
        ...

    async def sessions(
        self, limit: int = 100, offset: int = 0, *, tenant: str | None = None
    ) -> list[SessionSummary]:
        """Session summaries, most recently completed first (ties by session id); with
        ``tenant``, only that tenant's sessions."""
        ...

    async def session(self, session: str) -> SessionSummary | None:
        """One session's summary, None when no step of it is stored."""
        ...

    async def stats(self) -> StoreStats:
        """Counts over the whole store."""
        ...

    async def usage(
        self, by: UsageBy, since: str | None = None, tenant: str | None = None
    ) -> list[UsageGroup]:
        """The ledger's totals grouped ``by`` one dimension, ordered by the group's value.

        ``since`` is the first UTC day counted (``YYYY-MM-DD``; None: every day). ``tenant``
        restricts the lines to one tenant's (``""``: the lines without a tenant; None: every
        line). Every grouping but ``session`` reads the daily rollup.
        """
        ...

    async def session_usage(self, session: str) -> list[StepUsage]:
        """The ledger lines of a session's steps, in step order (``[]``: unknown session)."""
        ...

    async def delete_session(self, session: str) -> int:
        """Delete a session (its steps, ledger lines and seq counter; its lines are taken
        out of the rollup); return how many steps it had.

        For rebuilding one session from the broker: its seqs start at 1 again.
        """
        ...

    async def truncate(self) -> None:
        """Delete every session (schema and migrations stay), for a full rebuild."""
        ...

    async def ping(self) -> None:
        """Connect (and migrate) if needed and check the database answers: readiness."""
        ...

    async def close(self) -> None:
        """Release connections and threads. Idempotent; the store is unusable after it."""
        ...
