"""The broker package's exceptions, drawn once.

::

    BrokerError
    ├── BrokerUnavailable(url)            no server answered, or the connection closed
    ├── ServerStartError(binary, reason)  the embedded nats-server did not come up
    ├── TopologyError(what, detail)       a stream, consumer or bucket could not be provisioned
    ├── LayoutConflict(configured, found)  the broker holds chunk streams of another shard layout
    │   └── RegistryLayoutConflict(configured, found)  ... or step-registry buckets of another R
    ├── ReshardRefused(reason)             the old layout is not drained (or not recognised)
    ├── PublishError
    │   ├── PublishTimeout(subject, msg_id, waited_s)  no positive ack within the retry horizon
    │   ├── PublishRejected(subject, msg_id, code, description)  a permanent error ack
    │   ├── PayloadTooLarge(subject, size, limit)      payload + headers over max_payload
    │   └── FlushTimeout(in_flight, waited_s)          flush() gave up with acks outstanding
    ├── ReaderStalled(session, waited_s, last_seq)     a replay saw nothing while more was due
    ├── RequestFailed(what, reason, code)  an API request, acked publish or read went unanswered
    │                                      or was refused (no responders, a timeout, an error reply)
    └── StepRegistryError
        ├── StepClaimConflict(session, turn, step)     the triple is already claimed
        └── StepAssignmentContention(session, attempts)  compare-and-set kept losing

Every leaf carries its fields as attributes; foreign (nats-py) errors are translated once, at
the boundary (``broker._translate.translated``), with ``raise ... from exc`` so the cause stays
attached: no module outside this package catches a nats-py exception.
"""

from __future__ import annotations

from tokenwire.scrub import scrub


class BrokerError(Exception):
    """Base of every error raised by :mod:`tokenwire.broker`."""


class BrokerUnavailable(BrokerError):  # noqa: N818 - names fixed by the interface
    """No NATS server answered at ``url`` (or the connection is closed for good)."""

    def __init__(self, url: str, reason: str = "") -> None:
        self.url = scrub(url)  # an error leaves the process: no credentials (tokenwire.scrub)
        self.reason = scrub(reason)
        super().__init__(f"NATS unavailable at {self.url}" + (f": {self.reason}" if reason else ""))


class ServerStartError(BrokerError):
    """The embedded ``nats-server`` binary could not be found or did not accept connections."""

    def __init__(self, binary: str, reason: str) -> None:
        self.binary = binary
        self.reason = reason
        super().__init__(f"nats-server ({binary}) did not start: {reason}")


class TopologyError(BrokerError):
    """The server refused to create or update a stream, consumer or KV bucket."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"cannot provision {what}: {detail}")


class LayoutConflict(BrokerError):  # noqa: N818 - a condition, like PayloadTooLarge
    """The broker holds chunk streams of another layout (shards or partitions) than the one
    this process is configured for. ``configured`` and ``found`` describe both (the layout and
    the stream names). Nothing was created or changed: starting anyway would file new chunks
    where no reader of the other layout looks (docs/operations.md, "Changing the shard
    count")."""

    def __init__(self, configured: str, found: str) -> None:
        self.configured = configured
        self.found = found
        super().__init__(
            f"the broker holds chunk streams of another layout ({found}); this process is"
            f" configured for {configured}: set TOKENWIRE_SHARDS and TOKENWIRE_PARTITIONS to"
            " the broker's layout, or drain and run `tokenwire reshard` (docs/operations.md,"
            " 'Changing the shard count')"
        )


class RegistryLayoutConflict(LayoutConflict):
    """The broker holds step-registry buckets of another ``TOKENWIRE_REGISTRY_SHARDS`` than
    this process's. Nothing was created or changed: a session's pointer would be looked for in
    another bucket and its step numbers restart, so R is fixed per deployment (docs/operations.md,
    "The step registry's shards")."""

    def __init__(self, configured: str, found: str) -> None:
        self.configured = configured
        self.found = found
        BrokerError.__init__(
            self,
            f"the broker holds the step registry in other buckets ({found}); this process is"
            f" configured for {configured}: set TOKENWIRE_REGISTRY_SHARDS to the deployment's"
            " value (it cannot change on a deployment: docs/operations.md, 'The step"
            " registry's shards')",
        )


class ReshardRefused(BrokerError):  # noqa: N818 - a condition, like LayoutConflict
    """``tokenwire reshard`` changed nothing: ``reason`` says why (a partition of the old
    layout still has undelivered or unacknowledged chunks, or the streams found are not one
    layout)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"reshard refused: {reason}")


class PublishError(BrokerError):
    """A chunk could not be made durable; the step it belongs to failed."""


class PublishTimeout(PublishError):  # noqa: N818 - names fixed by the interface
    """No positive ack for ``msg_id`` after retrying for ``waited_s`` seconds."""

    def __init__(self, subject: str, msg_id: str, waited_s: float) -> None:
        self.subject = subject
        self.msg_id = msg_id
        self.waited_s = waited_s
        super().__init__(f"publish of {msg_id} to {subject} not acked after {waited_s:.1f} s")


class PayloadTooLarge(PublishError):  # noqa: N818 - a condition, like PublishTimeout
    """A message of ``size`` bytes (payload and headers, as the server counts them) is over
    the connected server's ``max_payload`` (``limit``); nothing was sent.

    ``room`` is the largest payload that fits beside the same headers, so a caller can split
    or shrink what it sends. Sending it anyway would make the server close the connection
    (nats-py then closes the client for good).
    """

    def __init__(self, subject: str, size: int, limit: int, room: int) -> None:
        self.subject = subject
        self.size = size
        self.limit = limit
        self.room = room
        super().__init__(
            f"message to {subject} is {size} bytes with its headers, over the server's "
            f"max_payload of {limit} bytes"
        )


class PublishRejected(PublishError):  # noqa: N818 - names fixed by the interface
    """The server answered with an error that retrying cannot fix (e.g. no such stream)."""

    def __init__(self, subject: str, msg_id: str, code: int, description: str) -> None:
        self.subject = subject
        self.msg_id = msg_id
        self.code = code
        self.description = description
        super().__init__(f"publish of {msg_id} to {subject} rejected ({code}): {description}")


class FlushTimeout(PublishError):  # noqa: N818 - names fixed by the interface
    """``flush()`` returned with ``in_flight`` messages still unacknowledged."""

    def __init__(self, in_flight: int, waited_s: float) -> None:
        self.in_flight = in_flight
        self.waited_s = waited_s
        super().__init__(f"{in_flight} messages still in flight after {waited_s:.1f} s")


class ReaderStalled(BrokerError):  # noqa: N818 - names fixed by the interface
    """A replay expected more messages of ``session`` but none came for ``waited_s``."""

    def __init__(self, session: str, waited_s: float, last_seq: int) -> None:
        self.session = session
        self.waited_s = waited_s
        self.last_seq = last_seq
        super().__init__(
            f"replay of {session} stalled after stream seq {last_seq} ({waited_s:.1f} s idle)"
        )


class RequestFailed(BrokerError):  # noqa: N818 - a condition, like PublishTimeout
    """``what`` (a JetStream API request, an acknowledged publish, a stored-message read) got
    no answer or an error answer; ``code`` is the server's ``err_code`` when it sent one.

    Retrying later is safe: none of these requests changes state unless the server answered.
    """

    def __init__(self, what: str, reason: str, code: int | None = None) -> None:
        self.what = what
        self.reason = scrub(reason)
        self.code = code
        super().__init__(f"{what} failed: {self.reason}")


class StepRegistryError(BrokerError):
    """Base of the step identity errors (KV bucket ``tokenwire-steps``)."""


class StepClaimConflict(StepRegistryError):  # noqa: N818 - names fixed by the interface
    """(session, turn, step) was already claimed by some gateway instance."""

    def __init__(self, session: str, turn: int, step: int) -> None:
        self.session = session
        self.turn = turn
        self.step = step
        super().__init__(f"step {session}/{turn}/{step} is already claimed")


class StepAssignmentContention(StepRegistryError):  # noqa: N818 - names fixed by the interface
    """``next_step`` lost the compare-and-set race ``attempts`` times in a row."""

    def __init__(self, session: str, attempts: int) -> None:
        self.session = session
        self.attempts = attempts
        super().__init__(f"could not assign a step for {session} after {attempts} attempts")
