"""The durable assembler: chunk stream in, one committed message (or recorded error) per step.

- :class:`Assembly` is the pure core (no broker, no store): envelopes in, closed steps out;
  ``tokenwire rebuild`` reuses it.
- :class:`Assembler` is one service instance: per-partition handlers, batched commits,
  acknowledgements only after the commit, dead-lettering, metrics.
- :func:`run` is the ``tokenwire assembler`` command (configured by :class:`AssemblerSettings`,
  e.g. ``AssemblerSettings.from_env()``).

Example::

    settings = AssemblerSettings(nats_urls=("nats://127.0.0.1:4333",),
                                 store_url="sqlite:///./.tokenwire/store.db", burst=True)
    await run(settings)         # drains the stream into the store, then returns

Flow, ack rules and the exactly-once argument: docs/assembler.md.
"""

from __future__ import annotations

from tokenwire.services.assembler._assembly import (
    Assembly,
    AssemblyConfig,
    ClosedStep,
    CloseReason,
    Outcome,
    Poisoned,
    PoisonReason,
    Settled,
    StepKey,
)
from tokenwire.services.assembler._committer import CommitPolicy, Committer
from tokenwire.services.assembler._consume import Delivery, PartitionSet, ack_tokens, nak_tokens
from tokenwire.services.assembler._errors import (
    AssemblerError,
    AssemblerLoopError,
    AssemblerStartError,
    AssemblyFullError,
)
from tokenwire.services.assembler._gc import YOUNG_THRESHOLD, tune_gc
from tokenwire.services.assembler._metrics import AssemblerMetrics, ProbeServer
from tokenwire.services.assembler._provision import provision
from tokenwire.services.assembler._run import run
from tokenwire.services.assembler._service import DLQ_CONSUMER, Assembler
from tokenwire.services.assembler._settings import AssemblerSettings

__all__ = [
    "DLQ_CONSUMER",
    "YOUNG_THRESHOLD",
    "Assembler",
    "AssemblerError",
    "AssemblerLoopError",
    "AssemblerMetrics",
    "AssemblerSettings",
    "AssemblerStartError",
    "Assembly",
    "AssemblyConfig",
    "AssemblyFullError",
    "CloseReason",
    "ClosedStep",
    "CommitPolicy",
    "Committer",
    "Delivery",
    "Outcome",
    "PartitionSet",
    "PoisonReason",
    "Poisoned",
    "ProbeServer",
    "Settled",
    "StepKey",
    "ack_tokens",
    "nak_tokens",
    "provision",
    "run",
    "tune_gc",
]
