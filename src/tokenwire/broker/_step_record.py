"""What the step registry keeps beside a claim: the request it was claimed for, and the
names the step's answer got; and the idempotency keys that map to a step.

A claim key (``<session>.<turn>.<step>``) holds a :class:`StepRecord` as JSON: the claim's
``token`` (whose claim it is), the request's ``fingerprint`` (a retry of the same request
resumes the step, another one is a conflict), the claiming gateway's bound on the step's
silence (``idle_s``: the assembler's abandonment check reads it, issue 48) and, once the
step's answer was named (``names``), the response id, model and creation time its caller
saw. A claim written before records existed holds the bare token: it reads as a record
without a fingerprint.

An idempotency key (``idem.k.<hash>``; never a session's key: sessions have no dots, and a
claim key's second token is a number) holds a :class:`KeyBinding`: the step the key's first
request was assigned and that request's fingerprint.

A thread key (``thread.<hash>``, the gateway's ``_access/threads.py``) holds a
:class:`ThreadMark`: the step whose answer the hash names, or ``ambiguous``. ``time_ns`` is
the broker's (the KV stream's clock: when the stored message was written).
"""

from __future__ import annotations

import msgspec


class StepNames(msgspec.Struct, frozen=True, omit_defaults=True):
    """How a step's answer was named to its caller (the provider's names when it gave them)."""

    response_id: str | None = None
    model: str | None = None
    created: int | None = None
    system_fingerprint: str | None = None


DEFAULT_CLAIM_IDLE_S = 95.0
"""The silence bound of a claim that does not state one (written before issue 48): the
gateway's defaults then, ``max_step_idle_seconds`` (60 s) plus ``ack_timeout_s`` (35 s)."""


class StepRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A claim key's value (see the module).

    ``idle_s``: while the claiming gateway lives, the broker stores the step's next chunk (or
    its end) within this many seconds of the gateway time of the step's last chunk (its
    ``max_step_idle_seconds`` plus ``ack_timeout_s``, the publish retries included); 0: not
    stated (:data:`DEFAULT_CLAIM_IDLE_S`).
    """

    token: str
    fingerprint: str = ""
    names: StepNames | None = None
    idle_s: float = 0.0
    time_ns: int = msgspec.field(default=0, name="_t")  # from the stored message, never written

    def silence_s(self) -> float:
        """The claim's silence bound (``idle_s``, or the default of older claims)."""
        return self.idle_s or DEFAULT_CLAIM_IDLE_S


class KeyBinding(msgspec.Struct, frozen=True, omit_defaults=True):
    """An idempotency key's value: the step it maps to, and its first request's fingerprint."""

    session: str
    turn: int
    step: int
    fingerprint: str
    time_ns: int = msgspec.field(default=0, name="_t")  # from the stored message, never written


class ThreadMark(msgspec.Struct, frozen=True, omit_defaults=True):
    """A thread key's value: the step it names, or ``ambiguous`` when answers of two sessions
    hashed alike (the key then names none)."""

    session: str = ""
    turn: int = 0
    step: int = 0
    pointer: tuple[int, int, int] | None = None
    """The session's step pointer as the marking gateway last knew it, ``(revision, turn,
    step)`` (None: unknown): the next assignment tries it (compare-and-set) before it reads
    the pointer; a stale one costs one failed attempt, never a wrong step."""
    ambiguous: bool = False


AMBIGUOUS = ThreadMark(ambiguous=True)

_record = msgspec.json.Decoder(StepRecord)
_mark = msgspec.json.Decoder(ThreadMark)
_binding = msgspec.json.Decoder(KeyBinding)


def encode_record(record: StepRecord) -> bytes:
    """The claim key's value (``time_ns`` left out: the stored message carries it)."""
    return msgspec.json.encode(msgspec.structs.replace(record, time_ns=0))


def decode_record(value: bytes, time_ns: int = 0) -> StepRecord:
    """A claim key's value; a bare token (a claim from before records) has no fingerprint."""
    try:
        record = _record.decode(value)
    except msgspec.DecodeError:
        record = StepRecord(token=value.decode("utf-8", "replace"))
    return msgspec.structs.replace(record, time_ns=time_ns)


def encode_binding(binding: KeyBinding) -> bytes:
    """An idempotency key's value (``time_ns`` left out)."""
    return msgspec.json.encode(msgspec.structs.replace(binding, time_ns=0))


def decode_binding(value: bytes, time_ns: int = 0) -> KeyBinding | None:
    """An idempotency key's value; None when it is not one (never written by us)."""
    try:
        binding = _binding.decode(value)
    except msgspec.DecodeError:
        return None
    return msgspec.structs.replace(binding, time_ns=time_ns)


def key_binding_key(key_hash: str) -> str:
    """The KV key of an idempotency key's binding (``key_hash``: hex digits)."""
    return f"idem.k.{key_hash}"


def thread_key(key_hash: str) -> str:
    """The KV key of a thread key's mark (``key_hash``: hex digits)."""
    return f"thread.{key_hash}"


def encode_mark(mark: ThreadMark) -> bytes:
    """A thread key's value."""
    return msgspec.json.encode(mark)


def decode_mark(value: bytes) -> ThreadMark:
    """A thread key's value; one that is not a mark reads as ambiguous (it names nothing)."""
    try:
        return _mark.decode(value)
    except msgspec.DecodeError:
        return AMBIGUOUS
