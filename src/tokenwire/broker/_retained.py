"""``retained_sessions``: every session with at least one chunk on a chunk stream: every
shard of the layout, and the streams of retired layouts (``tokenwire reshard``) that still
exist.

Read from the stream's per-subject counts (``STREAM.INFO`` with a subjects filter). The server
sends at most 100,000 subjects per answer (``JSMaxSubjectDetails``) and pages the rest by
offset; nats-py's ``stream_info`` asks for the first page only, which silently dropped every
session past the first 50,000 (each has a ``first`` and a ``next`` subject). Here every page
is read.

Pages are separate reads of a stream that may change between them: a subject removed before
a page boundary can shift a later one into the page already read, so a session written or
expiring while the pages are read may be missed; one at rest is always listed.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client

from tokenwire.broker._api import ApiError, api_request, server_url
from tokenwire.broker._errors import BrokerUnavailable, TopologyError
from tokenwire.broker._layout import retired_layouts
from tokenwire.broker._topology import Topology, parse_stored_subject

_TIMEOUT_S = 30.0  # one page walks up to 100,000 subjects under the stream's lock


async def retained_sessions(nc: Client, topology: Topology) -> set[str]:
    """The sessions with at least one stored chunk, reading every page of subjects of every
    chunk stream (the layout's shards, then the retired layouts' streams)."""
    sessions: set[str] = set()
    for layout in [topology, *await retired_layouts(nc, topology)]:
        for stream in layout.chunk_streams:
            if layout is not topology and not await _exists(nc, stream):
                continue  # a retired stream already aged out and deleted
            sessions |= await _stream_sessions(nc, topology, stream)
    return sessions


async def _stream_sessions(nc: Client, t: Topology, stream: str) -> set[str]:
    sessions: set[str] = set()
    offset = 0
    while True:
        subjects, total = await _page(nc, t, stream, offset)
        sessions.update(parse_stored_subject(t, s)[1] for s in subjects)
        offset += len(subjects)
        if not subjects or offset >= total:
            return sessions


async def _exists(nc: Client, stream: str) -> bool:
    try:
        await api_request(nc, f"$JS.API.STREAM.INFO.{stream}", timeout_s=_TIMEOUT_S)
    except ApiError as exc:
        if exc.code == 404:
            return False
        raise TopologyError(f"stream {stream}", exc.description) from exc
    return True


async def _page(nc: Client, t: Topology, stream: str, offset: int) -> tuple[list[str], int]:
    """One page of subjects and the number over all pages (``total``)."""
    request = {"subjects_filter": t.chunks_wildcard, "offset": offset}
    try:
        page: dict[str, Any] = await api_request(
            nc, f"$JS.API.STREAM.INFO.{stream}", request, timeout_s=_TIMEOUT_S
        )
    except ApiError as exc:
        if exc.code == 503:
            raise BrokerUnavailable(server_url(nc), exc.description) from exc
        raise TopologyError(f"stream {stream}", exc.description) from exc
    subjects = list((page.get("state") or {}).get("subjects") or {})
    return subjects, max(int(page.get("total", 0)), offset + len(subjects))
