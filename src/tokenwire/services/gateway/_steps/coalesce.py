"""Coalesced reads: a caller that does not need each token the moment it comes (an agent
that acts on whole messages) may let the gateway read the provider at most every N ms.

At 50 tokens/s every provider read brings one token, so the gateway pays its work per read
(the wake-up, the SSE parse, normalising, the bounds, the fold, the frame, the caller's write)
once per token (docs/capacity.md, "The gateway against relaying floors"). A step that
coalesces reads the provider, takes what came, then leaves the socket unread for N ms
(``UpstreamCall.batches(normaliser, every_s)``; the provider's connection is held, not
read). What the provider sends meanwhile waits in the kernel's buffer, and the next read
takes all of it in one pass: one wake-up, one parse, one write to the caller for several
tokens.

It changes only the timing, and only when asked for: by the request
(``x-tokenwire-coalesce-ms: N``) or by the deployment's default
(``TOKENWIRE_GATEWAY_COALESCE_MS``), which a request's ``0`` turns off:

- the reads up to the first that brings a chunk are not delayed: the time to first chunk
  and the telemetry signal stay as they are;
- later tokens reach the caller up to N ms later, several in one write;
- the chunks' times in the log are when the gateway read them, so the chunks of one read
  are microseconds apart (a replay plays them as a burst);
- the step's end comes up to N ms later.

The content never changes: the same chunks, the same ordinals, the same events for the
caller. The answer says what was applied (``x-tokenwire-coalesce-ms`` on the response).
ADR 0032.
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
