"""What the caller receives: a step's output, the bounded outbox, the streamed response.

- ``caller.py``: the caller's output (forwarded, encoded or folded), its :class:`Outbox` and
  the :class:`StepStream` response;
- ``scrubbed.py``: the caller's bytes without the gateway's credentials.

Below ``_observe``; it may import ``_routing`` and ``_dialects``.
"""
