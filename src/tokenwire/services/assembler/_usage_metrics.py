"""The ledger's Prometheus counters: tokens and cost of the steps this instance committed.

Counted once per step the store *inserted* (``CommittedStep.usage``), after the commit
returned, from the very line the commit wrote; a step found already stored is not counted
again. Labels are bounded: ``provider`` at 32 values, ``model`` at 100 (as the gateway's),
``tenant`` at 100 (``none`` for steps without one); past a bound the value is ``other``.

What the counters are not: the ledger. They are per process and start from 0 at every start
(``rate()``/``increase()`` read through resets); a step committed by an instance that died
before counting it is never counted by the instance that finds it stored, and ``tokenwire
rebuild`` (its own process) counts nothing. For totals, ask the store (``tokenwire usage``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from tokenwire.ledger import TOKEN_FIELDS, StepUsage
from tokenwire.observability import BoundedLabels, model_labels

_NS = "tokenwire_assembler_usage"
NO_TENANT = "none"
TOKEN_TYPES = {name: name.removesuffix("_tokens") for name in TOKEN_FIELDS}
"""``input_tokens`` -> ``input``: the ``type`` label values, as the gateway's token counter."""


@dataclass
class UsageMetrics:
    """Tokens and cost by provider, model and tenant (see the module docstring)."""

    registry: CollectorRegistry
    providers: BoundedLabels = field(default_factory=lambda: BoundedLabels(32, "other"))
    models: BoundedLabels = field(default_factory=model_labels)
    tenants: BoundedLabels = field(default_factory=lambda: BoundedLabels(100, "other"))

    def __post_init__(self) -> None:
        r, labels = self.registry, ["provider", "model", "tenant"]
        self.tokens = Counter(
            f"{_NS}_tokens",
            "Tokens of committed steps as reported by the provider (disjoint "
            "counts: their sum is what was billed), by type.",
            [*labels, "type"],
            registry=r,
        )
        self.cost = Counter(
            f"{_NS}_cost_usd",
            "Cost of committed steps priced by genai-prices, in USD.",
            labels,
            registry=r,
        )
        self.unpriced = Counter(
            f"{_NS}_unpriced_steps",
            "Committed steps without a cost (no or incomplete usage, or no price for the model).",
            labels,
            registry=r,
        )

    def count(self, line: StepUsage) -> None:
        """Count one inserted step's line.

        A negative token count (the provider's figures are kept as reported, and nothing
        bounds them below; the ledger stores the line unpriced) is not counted: a counter
        only goes up, and its ``inc`` raised ValueError, which ended the commit loop.
        """
        labels = (
            self.providers.admit(line.provider),
            self.models.admit(line.model),
            self.tenants.admit(line.tenant) if line.tenant is not None else NO_TENANT,
        )
        if line.usage is not None:
            for name, kind in TOKEN_TYPES.items():
                n = getattr(line.usage, name)
                if n is not None and n > 0:
                    self.tokens.labels(*labels, kind).inc(n)
        if line.cost_usd is None:
            self.unpriced.labels(*labels).inc()
        else:
            self.cost.labels(*labels).inc(float(line.cost_usd))
