"""``retained_sessions``: every session with at least one chunk on the stream.

Read from the stream's per-subject counts (``STREAM.INFO`` with a subjects filter). The server
sends at most 100,000 subjects per answer (``JSMaxSubjectDetails``) and pages the rest by
offset; nats-py's ``stream_info`` asks for the first page only, which silently dropped every
session past ~50,000 (each has a ``first`` and a ``next`` subject). Here every page is read.

Pages are separate reads of a stream that may change between them: a subject removed before
a page boundary can shift a later one into the page already read, so a session written or
expiring while the pages are read may be missed; one at rest is always listed.
"""

from __future__ import annotations

import json

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError

from tokenwire.broker._errors import BrokerUnavailable, TopologyError
from tokenwire.broker._topology import Topology, parse_stored_subject

_TIMEOUT_S = 30.0  # one page walks up to 100,000 subjects under the stream's lock


class _State(msgspec.Struct):
    subjects: dict[str, int] | None = None


class _ApiErr(msgspec.Struct):
    code: int = 0
    description: str = ""


class _InfoPage(msgspec.Struct):
    state: _State | None = None
    total: int = 0  # subjects matching the filter, over all pages
    error: _ApiErr | None = None


_page_decoder = msgspec.json.Decoder(_InfoPage)


async def retained_sessions(nc: Client, topology: Topology) -> set[str]:
    """The sessions with at least one stored chunk, reading every page of subjects."""
    sessions: set[str] = set()
    offset = 0
    while True:
        subjects, total = await _page(nc, topology, offset)
        sessions.update(parse_stored_subject(topology, s)[1] for s in subjects)
        offset += len(subjects)
        if not subjects or offset >= total:
            return sessions


async def _page(nc: Client, t: Topology, offset: int) -> tuple[list[str], int]:
    request = json.dumps({"subjects_filter": f"{t.prefix}.chunks.>", "offset": offset})
    try:
        reply = await nc.request(
            f"$JS.API.STREAM.INFO.{t.stream}", request.encode(), timeout=_TIMEOUT_S
        )
    except NatsError as exc:
        raise BrokerUnavailable(_url(nc), f"stream info: {exc!r}") from exc
    page = _page_decoder.decode(reply.data)
    if page.error is not None:
        raise TopologyError(f"stream {t.stream}", page.error.description)
    subjects = list((page.state.subjects if page.state else None) or {})
    return subjects, max(page.total, offset + len(subjects))


def _url(nc: Client) -> str:
    server = nc.connected_url
    return server.geturl() if server is not None else "nats://?"
