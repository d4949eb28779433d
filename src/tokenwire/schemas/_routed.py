"""How a routed step reached its provider: the public name, the deployment that answered, the
attempts that failed before it and the deployment's own price (docs/gateway.md, "Routes").

Carried on a step's first chunk only (ordinal 0, ``ChunkEnvelope.routed``), for a model the
routes file names; absent for ``provider/model``. Added in schema version 2 without a version
change: readers that do not know the field ignore it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

AttemptFailure = Literal[
    "connect", "timeout", "rate-limited", "server-error", "overloaded", "untranslatable"
]
"""Why an attempt before the first byte failed: a connection that could not be made (or closed
before an answer), no first token within the group's bound, a 429, a 5xx, an overloaded
answer (Anthropic's 529 / ``overloaded_error``), or a fallback whose dialect cannot carry the
request (nothing is sent: the translation refuses rather than drop a field)."""


class FailedAttempt(msgspec.Struct, frozen=True, omit_defaults=True):
    """One attempt of the step that failed before anything reached the caller.

    ``status`` is the provider's HTTP status when it answered one; ``retry_after_s`` its
    ``retry-after`` (the deployment's shared cooldown when it sent one).
    """

    deployment: str
    provider: str
    model: str
    failure: AttemptFailure
    message: str = ""
    status: int | None = None
    retry_after_s: float | None = None


class DeploymentPrice(msgspec.Struct, frozen=True, omit_defaults=True):
    """A deployment's own price, per token in pico-USD (10^-12 USD; the routes file's USD per
    million tokens times 10^6, exact for up to six decimals). A rate that is absent is not
    known: a step that used such tokens is not priced (never a guess)."""

    input_pusd: int
    output_pusd: int
    cache_read_pusd: int | None = None
    cache_write_pusd: int | None = None


class Routed(msgspec.Struct, frozen=True, omit_defaults=True):
    """The route of one step: the ``route`` (public model name) the caller asked for, the
    ``deployment`` that served it (for a step that failed, the last one tried), the
    ``attempts`` that failed before it, in order, and the deployment's ``price`` when the
    routes file gives one."""

    route: str
    deployment: str
    attempts: list[FailedAttempt] = msgspec.field(default_factory=list)
    price: DeploymentPrice | None = None
