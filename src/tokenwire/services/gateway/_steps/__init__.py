"""One step, live: the provider read to its end, each chunk bounded, framed and published.

- ``step.py``: :class:`StepRun` (and its :class:`StepPlan`), the step's state machine;
- ``deps.py``: :class:`GatewayDeps`, what the app and its steps run on;
- ``bounds.py``, ``watchdog.py``: the step's byte, chunk and time bounds;
- ``framing.py``, ``fit.py``: chunks into broker messages (frames; a chunk too large split or
  sent by reference);
- ``contract.py``: the fold's verdict on a streaming step; ``coalesce.py``: coalesced reads.

Below ``_api``; it may import ``_resume``, ``_access``, ``_observe``, ``_output``, ``_routing``
and ``_dialects``. Publishing semantics: docs/gateway-internals.md, "Publishing semantics".
"""
