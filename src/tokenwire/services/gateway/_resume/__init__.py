"""A claimed step read back from the broker, for a caller that asks for it again.

- ``resume.py``: the same request for a claimed step resumed in its caller's dialect;
- ``step_source.py``: the :class:`StepSource` seam, its broker and in-memory implementations.

Below ``_steps``; it may import ``_access``, ``_observe``, ``_output``, ``_routing`` and
``_dialects``. docs/gateway.md, "Resuming a step"; ADR 0029.
"""
