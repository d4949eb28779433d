"""The telemetry consumer's errors::

    TelemetryError
    └── TelemetryLoopError(loop, reason)  a pull loop ended while the instance ran

Broker errors are not re-wrapped while running: a failed publish or lookup is retried per
message (``Retry``), a failed poll makes the instance not ready (``_ready.py``).
"""

from __future__ import annotations


class TelemetryError(Exception):
    """Base of the telemetry consumer's errors."""


class TelemetryLoopError(TelemetryError):
    """A pull loop of a shard's ``telemetry`` consumer (``loop``: ``pull-<consumer>`` or
    ``work-<consumer>``) ended while the instance ran, for ``reason``. The instance stops with
    this error instead of running on without it (no first chunk handled, /readyz still 200)."""

    def __init__(self, loop: str, reason: str) -> None:
        super().__init__(f"the telemetry consumer's {loop} loop ended: {reason}; it stops")
        self.loop = loop
        self.reason = reason
