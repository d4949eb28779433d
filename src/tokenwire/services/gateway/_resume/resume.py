"""A retried step resumes: the same request for a claimed step gets that step back from the
broker, in its own dialect, without a provider call (docs/gateway.md, "Resuming a step";
ADR 0029).

- :func:`fingerprint`: what "the same request" is: the endpoint's path and the body as JSON
  with its keys sorted. Headers are not in it: the SDKs change some on every retry
  (``x-stainless-retry-count``, ``x-stainless-read-timeout``) and the identity headers name
  the step it is kept with.
- :func:`step_ref`: the gateway's own id of a resumable step's answer, made from the step
  (``chatcmpl-tw-<turn>-<step>-<session>``, ``msg_...``, ``resp_...``), so that a resumed
  stream names itself as the first one did; the provider's names, when the caller saw those
  (a forwarded stream, a folded answer), are kept with the claim (``StepRecord.names``).
- :class:`Resumer`: answers a resumed step: the stream rendered by the dialect's own encoder
  (the code that renders live chunks, ``_caller.EncodingOutput``) from the broker's chunks,
  from ordinal 0, then live until the step's finish; the folded answer for a non-streaming
  caller; the recorded error (502, ``x-should-retry: false``) for a step that ended as one.
  At most ``max_resumers`` callers resume one step at once on a gateway (429 past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import Response

from tokenwire.broker import StepNames
from tokenwire.fold import FoldError, StepFold
from tokenwire.schemas import ChunkEnvelope, Finish, RecordedError, StreamChunk
from tokenwire.services.gateway._access.identity import ResumeTarget, StepIdentity
from tokenwire.services.gateway._dialects import CallerCodec, R, Reply
from tokenwire.services.gateway._errors import (
    GatewayError,
    InvalidRequestError,
    RecordedStepError,
    StepAbandonedError,
    TooManyResumersError,
)
from tokenwire.services.gateway._output.caller import EncodingOutput, Outbox, StepStream
from tokenwire.services.gateway._resume.step_source import FromStore, StepSource

log = logging.getLogger("tokenwire.gateway")

RESUMED_HEADER = "x-tokenwire-resumed"
SOURCE_HEADER = "x-tokenwire-source"
RESUME_RETRY_AFTER_S = 1
"""The ``retry-after`` of a 429 past the resumer cap."""


def fingerprint(path: str, canonical: bytes) -> str:
    """The request's fingerprint: the path and the body encoded with sorted keys
    (``Body.canonical``), hashed."""
    return hashlib.sha256(path.encode() + b"\n" + canonical).hexdigest()[:32]


def key_hash(credential: str, key: str) -> str:
    """An idempotency key's hash, scoped to the credential it came with (another caller's
    identical key maps to another step)."""
    return hashlib.sha256(f"{credential}\n{key}".encode()).hexdigest()[:40]


def response_alias(response_id: str) -> str:
    """The hash a Responses answer's id is found under (``GET /v1/responses/{id}``), in the
    idempotency keys' table (a namespace no credential can reach)."""
    return key_hash("\x00response", response_id)


def step_ref(identity: StepIdentity) -> str:
    """The raw id of a resumable step's answer (see the module)."""
    return f"tw-{identity.turn}-{identity.step}-{identity.session}"


@dataclass(frozen=True)
class ResumeBounds:
    """``idle_s``: nothing of a running step for this long means it was abandoned (the step's
    idle bound plus the ack timeout); ``ended_after_s``: a step claimed this long ago must
    have ended (the step's time bound plus the ack timeout and the clock margin)."""

    idle_s: float
    ended_after_s: float
    outbox_bytes: int


class Resumer:
    """Answers resumed steps of one gateway (see the module)."""

    def __init__(
        self,
        source: StepSource,
        bounds: ResumeBounds,
        max_resumers: int,
        clock_ns: Callable[[], int],
    ) -> None:
        """``clock_ns``: wall clock compared with the claim's broker time (a step's age)."""
        self._source = source
        self._bounds = bounds
        self._max = max_resumers
        self._clock_ns = clock_ns
        self._active: Counter[tuple[str, int, int]] = Counter()
        self.tasks: set[asyncio.Task[None]] = set()

    async def answer(
        self, codec: CallerCodec[R], req: R, target: ResumeTarget, after: int | None = None
    ) -> Response:
        """The resumed step's answer; raises the :class:`GatewayError` that is the answer
        before any byte (a recorded error, the step gone or abandoned, the cap). ``after``:
        a Responses stream starts after the event of that ``sequence_number``."""
        ident = target.identity
        triple = (ident.session, ident.turn, ident.step)
        if self._active[triple] >= self._max:
            raise TooManyResumersError(
                f"step {ident.session}/{ident.turn}/{ident.step} already has {self._max} "
                "resumers on this gateway; retry later",
                limit=self._max,
            )
        self._active[triple] += 1
        release = _once(lambda: self._release(triple))
        try:
            chunks = self._chunks(target)
            first = await _first(chunks)
            reply = _reply(codec, target, first[0], req.model)
            if not req.stream:
                return await _folded(codec, chunks, first, reply, ident)
            return await self._streamed(
                codec,
                req,
                chunks=chunks,
                first=first,
                reply=reply,
                ident=ident,
                release=release,
                after=after,
            )
        except BaseException:
            release()
            raise
        finally:
            if not req.stream:
                release()

    def _release(self, triple: tuple[str, int, int]) -> None:
        self._active[triple] -= 1
        if self._active[triple] <= 0:
            del self._active[triple]

    def _chunks(self, target: ResumeTarget) -> AsyncGenerator[list[ChunkEnvelope], None]:
        ident, since = target.identity, target.record.time_ns
        age_s = (self._clock_ns() - since) / 1e9 if since else 0.0
        return self._source.chunks(
            (ident.session, ident.turn, ident.step),
            since,
            idle_s=self._bounds.idle_s,
            ended=age_s > self._bounds.ended_after_s,
        )

    async def _streamed(
        self,
        codec: CallerCodec[R],
        req: R,
        *,
        chunks: AsyncGenerator[list[ChunkEnvelope], None],
        first: list[ChunkEnvelope],
        reply: Reply,
        ident: StepIdentity,
        release: Callable[[], None],
        after: int | None = None,
    ) -> Response:
        head = first[0].chunk
        if isinstance(head, Finish) and head.error is not None:  # failed before it started
            release()
            raise RecordedStepError(head.error.message, retryable=head.error.retryable)
        output: EncodingOutput = EncodingOutput(codec.encoder(req, reply))
        opening = b""
        if after is not None:
            output = _After(output, after)
            opening = await _past(
                output, after=after, chunks=chunks, first=first, response_id=reply.response_id
            )
        else:
            opening = output.opening() + _rendered(output, first)
        outbox = Outbox(self._bounds.outbox_bytes)
        task = asyncio.create_task(_pump(output, chunks, outbox, opening, release))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        headers = {**ident.headers(), "cache-control": "no-cache", RESUMED_HEADER: "true"}
        return StepStream(outbox, {**headers, **_source(first)}, lambda: _cancel(task))


_SEQUENCE = re.compile(rb'"sequence_number":(\d+)}\n')


async def _past(
    output: EncodingOutput,
    *,
    after: int,
    chunks: AsyncGenerator[list[ChunkEnvelope], None],
    first: list[ChunkEnvelope],
    response_id: str,
) -> bytes:
    """The caller's first bytes after event ``after``, reading the step on until it renders
    one (a running step: as it comes); InvalidRequestError (400, ``starting_after``) when the
    step ended before any, so that a cursor past the end is never an empty 200."""
    rendered = output.opening() + _rendered(output, first)
    if rendered:
        return rendered
    async for batch in chunks:
        if rendered := _rendered(output, batch):
            return rendered
    await chunks.aclose()
    raise InvalidRequestError(
        f"starting_after {after} is past the last event of response {response_id!r}",
        param="starting_after",
    )


class _After(EncodingOutput):
    """A Responses stream from the event after ``after`` (``starting_after``): events are
    rendered from the step's start (the encoder's state needs every chunk) and those with a
    ``sequence_number`` up to ``after`` are left out."""

    def __init__(self, inner: EncodingOutput, after: int) -> None:
        self._inner = inner
        self._after = after

    def _kept(self, data: bytes) -> bytes:
        events = data.split(b"\n\n")[:-1]  # each rendering is whole events
        return b"".join(e + b"\n\n" for e in events if self._later(e + b"\n"))

    def _later(self, event: bytes) -> bool:
        found = _SEQUENCE.search(event)
        return found is None or int(found.group(1)) > self._after

    def opening(self) -> bytes:
        return self._kept(self._inner.opening())

    def chunk(self, chunk: StreamChunk) -> bytes:
        return self._kept(self._inner.chunk(chunk))

    def ending(self) -> bytes:
        return self._kept(self._inner.ending())

    def failure(self, message: str) -> bytes:
        return self._inner.failure(message)


def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return run


async def _first(chunks: AsyncGenerator[list[ChunkEnvelope], None]) -> list[ChunkEnvelope]:
    """The step's first envelopes (ordinal 0 first); the source's error before any."""
    async for batch in chunks:
        if batch:
            return batch
    raise StepAbandonedError("the step ended without a chunk")  # a source never does this


def _reply(codec: CallerCodec[R], target: ResumeTarget, first: ChunkEnvelope, model: str) -> Reply:
    """How the step's answer was named: the names kept with the claim, else those the
    gateway derives from the step and the request (as the first answer did for a resumable
    step: ``model`` is the caller's, the time the first request's)."""
    names = target.record.names or StepNames()
    created = (first.request_time_ns or first.time_ns) // 1_000_000_000
    return Reply(
        names.response_id or codec.reply_id(step_ref(target.identity)),
        names.model or model,
        names.created if names.created is not None else created,
        names.system_fingerprint,
    )


def _rendered(output: EncodingOutput, batch: list[ChunkEnvelope]) -> bytes:
    """The caller's bytes for ``batch``; after a normal finish, the stream's terminator too
    (a stored finish was acknowledged: the step is captured)."""
    out = b"".join(output.chunk(e.chunk) for e in batch)
    last = batch[-1].chunk
    if isinstance(last, Finish) and last.error is None and last.reason != "aborted":
        out += output.ending()
    return out


async def _pump(
    output: EncodingOutput,
    chunks: AsyncGenerator[list[ChunkEnvelope], None],
    outbox: Outbox,
    opening: bytes,
    release: Callable[[], None],
) -> None:
    """Feed the resumer's outbox: the opening, then each batch as the broker gives it; a
    source failure after the start ends the stream with the dialect's error."""
    try:
        await outbox.put(opening)
        async for batch in chunks:
            await outbox.put(_rendered(output, batch))
    except GatewayError as exc:
        if exc.detail:  # the caller is told what failed, the log also how
            log.warning("resumed step failed while streaming: %s (%s)", exc.message, exc.detail)
        await outbox.put(output.failure(exc.message))
    finally:
        outbox.close()
        release()
        with contextlib.suppress(Exception):
            await chunks.aclose()


def _source(first: list[ChunkEnvelope]) -> dict[str, str]:
    """``x-tokenwire-source: store`` for a step read from the store's chunk log."""
    return {SOURCE_HEADER: "store"} if isinstance(first, FromStore) else {}


async def _folded(
    codec: CallerCodec[R],
    chunks: AsyncGenerator[list[ChunkEnvelope], None],
    first: list[ChunkEnvelope],
    reply: Reply,
    ident: StepIdentity,
) -> Response:
    """A non-streaming resumer's answer: the step folded (waiting for its end)."""
    fold = StepFold()
    try:
        for envelope in first:
            _feed(fold, envelope)
        async for batch in chunks:
            for envelope in batch:
                _feed(fold, envelope)
    finally:
        await chunks.aclose()
    result = fold.result()
    if isinstance(result, RecordedError):
        raise RecordedStepError(result.message, retryable=result.retryable)
    headers = {**ident.headers(), RESUMED_HEADER: "true", **_source(first)}
    body = codec.message_body(result, reply)
    return Response(body, media_type="application/json", headers=headers)


def _feed(fold: StepFold, envelope: ChunkEnvelope) -> None:
    with contextlib.suppress(FoldError):  # after the finish: the fold has its answer
        fold.feed(envelope.chunk)
