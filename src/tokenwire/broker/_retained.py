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

from typing import Any

from nats.aio.client import Client

from tokenwire.broker._api import ApiError, api_request, server_url
from tokenwire.broker._errors import BrokerUnavailable, TopologyError
from tokenwire.broker._topology import Topology, parse_stored_subject

_TIMEOUT_S = 30.0  # one page walks up to 100,000 subjects under the stream's lock


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
    """One page of subjects and the number over all pages (``total``)."""
    request = {"subjects_filter": f"{t.prefix}.chunks.>", "offset": offset}
    try:
        page: dict[str, Any] = await api_request(
            nc, f"$JS.API.STREAM.INFO.{t.stream}", request, timeout_s=_TIMEOUT_S
        )
    except ApiError as exc:
        if exc.code == 503:
            raise BrokerUnavailable(server_url(nc), exc.description) from exc
        raise TopologyError(f"stream {t.stream}", exc.description) from exc
    subjects = list((page.get("state") or {}).get("subjects") or {})
    return subjects, max(int(page.get("total", 0)), offset + len(subjects))
