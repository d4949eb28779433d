"""One session's stored chunks, in batches, for replay: the broker's bounded batched reader
(``broker._batches``) with its stall reported as the replay's :class:`ReplayStalled`."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from tokenwire.broker import (
    READ_IDLE_TIMEOUT_S,
    Connection,
    RawChunk,
    ReaderStalled,
    ReadWindow,
    Topology,
    session_batches,
)
from tokenwire.replay._errors import ReplayStalled

DEFAULT_IDLE_TIMEOUT_S = READ_IDLE_TIMEOUT_S


async def stored_chunks(
    nc: Connection,
    topology: Topology,
    session: str,
    from_seq: int | None = None,
    *,
    follow: bool = False,
    window: ReadWindow | None = None,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> AsyncGenerator[list[RawChunk], None]:
    """Yield the session's stored chunks from ``from_seq`` (inclusive) in stream order, in
    batches of at most ``window.messages`` (see ``broker.session_batches``: at most a window
    in flight, nothing pulled while the caller does not iterate); ReplayStalled when what was
    due stopped coming."""
    batches = session_batches(
        nc, topology, session, from_seq, follow=follow, window=window, idle_timeout_s=idle_timeout_s
    )
    try:
        async for batch in batches:
            yield batch
    except ReaderStalled as exc:
        raise ReplayStalled(exc.session, exc.waited_s, exc.last_seq) from exc
    finally:
        await batches.aclose()
