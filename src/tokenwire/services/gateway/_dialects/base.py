"""The typed interface every caller dialect implements, and what they share.

A caller dialect (:data:`CallerDialect`: an endpoint of the gateway) is one
:class:`CallerCodec`: it validates the caller's body into its request type, turns that into
the neutral request (another provider dialect) or forwards it (the same one), and writes
everything the caller receives: the stream (:class:`StreamEncoder` from chunks, or
:class:`Forwarder` over the provider's own events), the non-streaming body and the error body.
A provider dialect (every :class:`~tokenwire.providers.Dialect`) writes the provider body from
the neutral request (``neutral_to_*`` in its module, chosen in ``_dialects/__init__.py``).

This module imports no dialect module: they import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from tokenwire.providers import Dialect
from tokenwire.schemas import Message, StreamChunk
from tokenwire.services.gateway._dialects.neutral import NeutralRequest
from tokenwire.services.gateway._errors import GatewayError
from tokenwire.sse import SseEvent

CallerDialect = Literal[Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES, Dialect.OPENAI_RESPONSES]
"""The dialects the gateway's endpoints speak: a subset of the provider dialects (a caller
cannot speak Gemini's)."""


@dataclass(frozen=True)
class Reply:
    """Ids and names of one response: ``response_id`` is ``chatcmpl-...``, ``msg_...`` or
    ``resp_...``; ``system_fingerprint`` only on a resumed stream whose provider sent one
    (OpenAI Chat puts it on every chunk)."""

    response_id: str
    model: str
    created: int
    system_fingerprint: str | None = None


def provider_reply(reply: Reply, response_id: str | None, model: str | None) -> Reply:
    """The reply named as the provider named its answer (its response id and model), where
    the provider sent them; the gateway's own id and the route otherwise."""
    return Reply(response_id or reply.response_id, model or reply.model, reply.created)


class CallerRequest(Protocol):
    """What the gateway reads from every dialect's validated request."""

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    @property
    def ends_with_tool_result(self) -> bool: ...

    @property
    def opens_conversation(self) -> bool:
        """Nothing in the request came from the model (no earlier answer or tool result): the
        conversation's first call, a hint that its session is new (``StepAllocator``)."""
        ...


R = TypeVar("R", bound=CallerRequest)


class StreamEncoder(Protocol):
    """Normalised chunks to the caller's stream (a provider of another dialect)."""

    def start(self) -> bytes:
        """The stream's opening, once the provider answered."""
        ...

    def encode(self, chunk: StreamChunk) -> bytes:
        """The bytes for one chunk (often empty)."""
        ...

    def end(self) -> bytes:
        """The stream's terminator, sent once every chunk is acknowledged."""
        ...

    def failure(self, message: str) -> bytes:
        """The dialect's in-stream error, when the step fails after the stream began."""
        ...


class Forwarder(Protocol):
    """The provider's own events to the caller (a provider of the same dialect)."""

    error_sent: bool
    """Whether the caller was already sent an error event (the provider's or ours)."""

    def forwarded(self, event: SseEvent) -> bool:
        """Whether ``event`` goes to the caller now (never the terminator, held for the acks,
        nor anything after it)."""
        ...

    def end(self) -> bytes:
        """The held terminator, sent once every chunk is acknowledged."""
        ...

    def failure(self, message: str) -> bytes:
        """The dialect's in-stream error, when the step fails after the stream began."""
        ...


class CallerCodec(Protocol[R]):
    """One caller dialect, from the request body to every byte its caller receives."""

    @property
    def dialect(self) -> CallerDialect: ...

    def parse(self, body: dict[str, Any]) -> R:
        """The validated request (400 :class:`InvalidRequestError` naming what is wrong)."""
        ...

    def to_neutral(self, req: R) -> NeutralRequest:
        """The request in the neutral form (for a provider of another dialect)."""
        ...

    def forwarded_body(self, body: dict[str, Any], model: str) -> bytes:
        """The body for a provider of this same dialect: as sent, ``model`` replaced,
        streamed (and whatever the dialect needs to capture usage)."""
        ...

    def encoder(self, req: R, reply: Reply) -> StreamEncoder:
        """The stream encoder for a streaming call to a provider of another dialect."""
        ...

    def forwarder(self, req: R) -> Forwarder:
        """The event filter for a streaming call to a provider of this dialect."""
        ...

    def reply_id(self, raw_id: str) -> str:
        """The gateway's response id in this dialect's form, from a fresh id."""
        ...

    def message_body(self, message: Message, reply: Reply) -> bytes:
        """The non-streaming answer: the folded message in this dialect."""
        ...

    def error_body(self, exc: GatewayError) -> bytes:
        """The error answer in this dialect."""
        ...


def frame(event: SseEvent) -> bytes:
    """One event in SSE framing (``event:`` only when named, one ``data:`` line per line)."""
    if event.event == "message" and "\n" not in event.data:
        return b"data: " + event.data.encode() + b"\n\n"  # the usual event: one data line
    head = b"" if event.event == "message" else b"event: " + event.event.encode() + b"\n"
    lines = b"".join(b"data: " + line.encode() + b"\n" for line in event.data.split("\n"))
    return head + lines + b"\n"


def openai_error_type(exc: GatewayError) -> str:
    """OpenAI's error ``type`` for a gateway error (shared by Chat and Responses); a budget
    exhausted is OpenAI's own ``insufficient_quota``."""
    if exc.code == "insufficient_quota":
        return "insufficient_quota"
    return {401: "authentication_error", 404: "invalid_request_error", 429: "rate_limit_error"}.get(
        exc.status, "invalid_request_error" if exc.status < 500 else "api_error"
    )
