"""What the gateway tells operators: its Prometheus metrics, a model call's span and figures.

- ``metrics.py``: the app's own Prometheus registry;
- ``genai.py``: a model call as the GenAI conventions see it (span attributes, figures);
- ``trace.py``: the call's CLIENT span, continued from the caller's ``traceparent``.

Below ``_access``; it may import ``_output``, ``_routing`` and ``_dialects``.
docs/telemetry.md.
"""
