"""``StepClaims``: a step's claim read without a registry, for the assembler.

Before the assembler records a step ``abandoned`` it asks whether the gateway that claimed it
may still publish to it (issue 48): the claim key ``<session>.<turn>.<step>`` in the session's
registry bucket, read from the bucket's leader with one ``STREAM.MSG.GET`` (``last_by_subj``,
as ``StepRegistry.record`` reads it). The read-only seam has the shape of
``StepRegistry.record``, so ``MemoryStepRegistry`` is its twin in unit tests.
"""

from __future__ import annotations

from nats.aio.client import Client

from tokenwire.broker._messages import last_stored
from tokenwire.broker._step_record import StepRecord, decode_record
from tokenwire.broker._topology import Topology

_DELETED = ("DEL", "PURGE")


class StepClaims:
    """Reads claims of ``topology``'s registry (see the module)::

    record = await StepClaims(nc, topology).record("s-42", 3, 0)  # None: none held
    """

    def __init__(self, nc: Client, topology: Topology, timeout_s: float = 2.0) -> None:
        self._nc = nc
        self._topology = topology
        self._timeout_s = timeout_s

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None:
        """The claim's record with the broker's time of it; None when the bucket holds none
        (never claimed, expired with the bucket's TTL, or deleted). ``RequestFailed`` when
        the broker did not answer."""
        bucket = self._topology.registry_bucket_of(session)
        subject = f"$KV.{bucket}.{session}.{turn}.{step}"
        stored = await last_stored(self._nc, f"KV_{bucket}", subject, timeout_s=self._timeout_s)
        if stored is None or stored.headers.get("KV-Operation") in _DELETED:
            return None
        return decode_record(stored.data, stored.time_ns)
