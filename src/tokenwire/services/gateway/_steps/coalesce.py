"""Coalesced reads: a caller that does not need each token the moment it comes (an agent
that acts on whole messages) may let the gateway read the provider at most every N ms.

A step that coalesces reads the provider, takes what came, then leaves the socket unread for
N ms (``UpstreamCall.batches(normaliser, every_s)``), so the next read takes several tokens in
one pass. Asked for by the request (``x-tokenwire-coalesce-ms: N``) or the deployment's
default (``TOKENWIRE_GATEWAY_COALESCE_MS``), which a request's ``0`` turns off; only the
timing changes, never the content, and the answer says what was applied. What changes and
what does not: docs/gateway.md, "Coalesced reads"; ADR 0032.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.variables import MAX_COALESCE_MS

COALESCE_HEADER = "x-tokenwire-coalesce-ms"


def coalesce_ms(headers: Mapping[str, str], default: int) -> int:
    """The request's wait between provider reads in ms: its header, else ``default``;
    InvalidRequestError (400) for anything but a whole number from 0 to the maximum."""
    raw = headers.get(COALESCE_HEADER)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_COALESCE_MS:
        raise InvalidRequestError(
            f"X-Tokenwire-Coalesce-Ms must be a whole number of milliseconds from 0 to "
            f"{MAX_COALESCE_MS}, got {raw!r}",
            param=COALESCE_HEADER,
        )
    return int(text)


def answered(ms: int) -> dict[str, str]:
    """The response header that says the step's reads were coalesced (none when not)."""
    return {COALESCE_HEADER: str(ms)} if ms else {}
