"""Each stored step's parent (``ChunkEnvelope.parent`` on its first chunk), read from the
store's chunk log, for the views of the stored messages (``tokenwire messages``, ``GET
/v1/sessions/{s}/messages``): the step it answers or continues, the previous step of its
turn, or the step of another session that spawned it (docs/gateway.md, "Threading")."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from tokenwire.schemas import ChunkEvent, ErrorEvent, MessageEvent, StepLink
from tokenwire.store import Store


async def stored_parents(
    store: Store, session: str, outcomes: Sequence[MessageEvent | ErrorEvent]
) -> dict[tuple[int, int], StepLink]:
    """``(turn, step) -> parent`` of the outcomes' steps that have one (a read of each
    step's first chunk)."""
    parents: dict[tuple[int, int], StepLink] = {}
    for outcome in outcomes:
        if outcome.seq_end < outcome.seq_start:
            continue  # no chunk: nothing recorded
        for event in await store.session_events(session, outcome.seq_start, outcome.seq_start):
            if isinstance(event, ChunkEvent) and isinstance(event.envelope.parent, StepLink):
                parents[outcome.turn, outcome.step] = event.envelope.parent
    return parents


def with_parent(
    outcome: MessageEvent | ErrorEvent, parents: dict[tuple[int, int], StepLink]
) -> dict[str, object]:
    """The outcome as JSON-ready data with its ``parent`` (null when it has none)."""
    data: dict[str, object] = msgspec.to_builtins(outcome)
    parent = parents.get((outcome.turn, outcome.step))
    data["parent"] = msgspec.to_builtins(parent) if parent is not None else None
    return data
