"""``verify``: fold the retained chunks with the one fold and compare, step by step, with the store.

Every (turn, step) on either side yields at most one :class:`Difference` kind:
``missing-in-store``, ``not-retained``, ``outcome``, ``message`` / ``error``, ``chunks`` or
``seq-range``. A retained step without its finish folds to a ``gap`` or ``abandoned`` error,
which a stored error of either kind matches; a retained chunk the assembler rejects is left
out of the fold as the assembler leaves it out, and still shows as a ``chunks`` difference.
What each kind means: docs/replay.md, "Verify semantics".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from tokenwire.broker import Connection, Topology, valid_session
from tokenwire.fold import InvalidOrdinal, ReorderWindowError, StepCollector
from tokenwire.replay._errors import InvalidSessionId, SessionNotFound, UndecodableChunk
from tokenwire.replay._source import stored_chunks
from tokenwire.schemas import (
    ChunkEnvelope,
    ChunkEvent,
    ErrorEvent,
    Message,
    MessageEvent,
    RecordedError,
    chunk_envelopes,
    json_encoder,
)
from tokenwire.store import Store

DifferenceKind = Literal[
    "missing-in-store", "not-retained", "outcome", "message", "error", "chunks", "seq-range"
]
StepKey = tuple[int, int]
_UNFINISHED_KINDS = ("gap", "abandoned")


class Difference(msgspec.Struct, frozen=True):
    """One way the store differs from the retained stream, at step (``turn``, ``step``)."""

    turn: int
    step: int
    kind: DifferenceKind
    detail: str

    def __str__(self) -> str:
        return f"turn {self.turn} step {self.step}: {self.kind}: {self.detail}"


@dataclass
class _Retained:
    """One step's retained chunks by ordinal (first copy wins) and the stream seq of each
    chunk's message (a frame's chunks share theirs)."""

    chunks: dict[int, ChunkEnvelope] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)

    def add(self, seq: int, envelope: ChunkEnvelope) -> None:
        self.chunks.setdefault(envelope.ordinal, envelope)
        self.seqs.append(seq)

    def fold(self) -> Message | RecordedError:
        """The step as the assembler folds it: a chunk it rejects is left out (dead-lettered
        there), and one past the reorder window means the ordinals before it are missing."""
        collector = StepCollector()
        too_far = False
        for ordinal in sorted(self.chunks):
            if collector.complete:
                break
            try:
                collector.add(ordinal, self.chunks[ordinal].chunk)
            except InvalidOrdinal:
                continue
            except ReorderWindowError:
                too_far = True  # every later ordinal is further ahead still
                break
        if collector.complete:
            return collector.result()
        if too_far or collector.missing() or collector.buffered:
            return collector.fail("gap", "the retained chunks of the step have a gap")
        return collector.fail("abandoned", "the retained chunks end without a finish")


@dataclass
class VerifyReport:
    """What :func:`verify_report` checked, and the differences it found."""

    steps: int
    chunks: int
    differences: list[Difference]


async def verify(
    nc: Connection, topology: Topology, store: Store, session: str
) -> list[Difference]:
    """Compare the store's record of ``session`` with the fold of its retained chunks.

    Returns the differences in (turn, step) order; ``[]`` means the store is exactly the
    projection of the retained stream. Raises InvalidSessionId, SessionNotFound (neither the
    broker nor the store knows the session), BrokerUnavailable, StoreError.
    """
    return (await verify_report(nc, topology, store, session)).differences


async def verify_report(
    nc: Connection, topology: Topology, store: Store, session: str
) -> VerifyReport:
    """:func:`verify`, with how many steps and retained chunks were checked."""
    if not valid_session(session):
        raise InvalidSessionId(session)
    retained = await _retained(nc, topology, session)
    report = await compare_with_store(retained, store, session)
    if not report.steps:
        raise SessionNotFound(session, topology.stream_of(session))
    return report


class RetainedSteps:
    """A session's retained chunks, by step, as verify reads them: fed one envelope at a time
    with the stream seq of its message (``tokenwire rebuild --repair`` feeds the envelopes it
    reads for the assembler's core, and compares without a second read)."""

    def __init__(self) -> None:
        self._steps: defaultdict[StepKey, _Retained] = defaultdict(_Retained)

    def add(self, seq: int, envelope: ChunkEnvelope) -> None:
        """One retained chunk (a frame's chunks share their message's ``seq``)."""
        self._steps[envelope.turn, envelope.step].add(seq, envelope)

    def steps(self) -> dict[StepKey, _Retained]:
        return dict(self._steps)


async def compare_with_store(retained: RetainedSteps, store: Store, session: str) -> VerifyReport:
    """The differences between the store's record of ``session`` and ``retained`` (see the
    module for their kinds), in (turn, step) order. Raises StoreError."""
    steps = retained.steps()
    outcomes = {(o.turn, o.step): o for o in await store.messages(session)}
    logs = _chunk_logs(await store.session_events(session)) if outcomes else {}
    differences: list[Difference] = []
    for key in sorted(steps.keys() | outcomes.keys()):
        differences += _compare(key, steps.get(key), outcomes.get(key), logs.get(key, []))
    chunks = sum(len(r.seqs) for r in steps.values())
    return VerifyReport(len(steps.keys() | outcomes.keys()), chunks, differences)


async def _retained(nc: Connection, topology: Topology, session: str) -> RetainedSteps:
    steps = RetainedSteps()
    async for batch in stored_chunks(nc, topology, session):
        for seq, payload in batch:
            try:
                envelopes = chunk_envelopes(payload)
            except msgspec.MsgspecError as exc:
                raise UndecodableChunk(seq, str(exc)) from exc
            for envelope in envelopes:
                steps.add(seq, envelope)
    return steps


def _chunk_logs(events: Sequence[object]) -> dict[StepKey, list[ChunkEvent]]:
    logs: defaultdict[StepKey, list[ChunkEvent]] = defaultdict(list)
    for event in events:
        if isinstance(event, ChunkEvent):
            logs[event.envelope.turn, event.envelope.step].append(event)
    return dict(logs)


def _compare(
    key: StepKey,
    retained: _Retained | None,
    stored: MessageEvent | ErrorEvent | None,
    log: list[ChunkEvent],
) -> list[Difference]:
    turn, step = key
    if retained is None:
        return [Difference(turn, step, "not-retained", "the broker retains no chunk of it")]
    if stored is None:
        first, last = min(retained.seqs), max(retained.seqs)
        detail = f"retained at stream seq {first}-{last}, no stored outcome"
        return [Difference(turn, step, "missing-in-store", detail)]
    partly = _partly_retained(retained, log)
    if partly:
        return [Difference(turn, step, "not-retained", partly), *_compare_range(key, stored, log)]
    out = _compare_outcome(key, retained.fold(), stored)
    out += _compare_chunks(key, retained, log)
    out += _compare_range(key, stored, log)
    return out


def _partly_retained(retained: _Retained, log: list[ChunkEvent]) -> str:
    """Why the step cannot be checked when retention removed some of its chunks: the broker
    retains only the stored chunks' last ordinals (a step is published in ordinal order, and
    retention removes the stream's oldest messages), each equal to its stored copy (the store
    only ever holds what the broker had). ``""`` when that is not the case."""
    stored = {e.envelope.ordinal: e.envelope for e in log}
    kept = retained.chunks
    if not kept or len(kept) >= len(stored) or not kept.keys() <= stored.keys():
        return ""
    if kept.keys() != {ordinal for ordinal in stored if ordinal >= min(kept)}:
        return ""  # a hole that is not the step's start: not retention's doing
    if any(stored[ordinal] != envelope for ordinal, envelope in kept.items()):
        return ""
    return (
        f"the broker retains {len(kept)} of its {len(stored)} stored chunks (ordinals "
        f"{_span(kept)} of {_span(stored)}); retention removed the rest"
    )


def _compare_outcome(
    key: StepKey, folded: Message | RecordedError, stored: MessageEvent | ErrorEvent
) -> list[Difference]:
    turn, step = key
    if isinstance(stored, MessageEvent) and isinstance(folded, Message):
        detail = _message_detail(stored.message, folded)
        return [Difference(turn, step, "message", detail)] if detail else []
    if isinstance(stored, ErrorEvent) and isinstance(folded, RecordedError):
        detail = _error_detail(stored.error, folded)
        return [Difference(turn, step, "error", detail)] if detail else []
    stored_text = _describe(stored.message if isinstance(stored, MessageEvent) else stored.error)
    return [
        Difference(
            turn, step, "outcome", f"stored {stored_text}, retained fold to {_describe(folded)}"
        )
    ]


def _message_detail(stored: Message, folded: Message) -> str:
    """Which fields differ, with the text shown when the visible text differs."""
    if stored == folded:
        return ""
    if stored.text != folded.text:
        return f"text differs: stored {_clip(stored.text)} vs retained {_clip(folded.text)}"
    fields = [f for f in Message.__struct_fields__ if getattr(stored, f) != getattr(folded, f)]
    parts = [
        f"{f}: stored {_clip(_json(getattr(stored, f)))} vs retained "
        f"{_clip(_json(getattr(folded, f)))}"
        for f in fields
    ]
    return "; ".join(parts)


def _error_detail(stored: RecordedError, folded: RecordedError) -> str:
    if folded.kind in _UNFINISHED_KINDS:
        if stored.kind in _UNFINISHED_KINDS:
            return ""
        return f"stored {stored.kind} error, the retained chunks end without a finish"
    if stored == folded:
        return ""
    return f"stored {_json(stored)} vs retained {_json(folded)}"


def _compare_chunks(key: StepKey, retained: _Retained, log: list[ChunkEvent]) -> list[Difference]:
    turn, step = key
    stored = {e.envelope.ordinal: e.envelope for e in log}
    if sorted(stored) != sorted(retained.chunks):
        detail = (
            f"stored {len(stored)} chunks (ordinals {_span(stored)}), retained "
            f"{len(retained.chunks)} (ordinals {_span(retained.chunks)})"
        )
        return [Difference(turn, step, "chunks", detail)]
    changed = [o for o in sorted(stored) if stored[o] != retained.chunks[o]]
    if changed:
        detail = f"{len(changed)} stored chunk(s) differ from the retained ones, first ordinal "
        return [Difference(turn, step, "chunks", f"{detail}{changed[0]}")]
    return []


def _compare_range(
    key: StepKey, stored: MessageEvent | ErrorEvent, log: list[ChunkEvent]
) -> list[Difference]:
    seqs = [e.seq for e in log]
    expected = list(range(stored.seq_start, stored.seq_end + 1))
    if seqs == expected:
        return []
    have = f"{seqs[0]}-{seqs[-1]}" if seqs else "none"
    detail = (
        f"outcome cites the session's chunks {stored.seq_start}-{stored.seq_end}, the "
        f"chunk log holds {have}"
    )
    return [Difference(key[0], key[1], "seq-range", detail)]


def _describe(outcome: Message | RecordedError) -> str:
    if isinstance(outcome, Message):
        return f"a message ({outcome.finish_reason})"
    return f"a {outcome.kind} error ({_clip(outcome.message)})"


def _span(ordinals: dict[int, ChunkEnvelope]) -> str:
    return f"{min(ordinals)}-{max(ordinals)}" if ordinals else "none"


def _json(value: object) -> str:
    return json_encoder.encode(value).decode()


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
