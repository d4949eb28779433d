"""Towards the provider: which provider a model goes to, and the call made to it.

- ``routing.py``: ``provider/model`` to a :class:`Route` (URL, dialect, credential);
- ``provider_call.py``: the provider's request (forwarded or translated); ``forward.py``: the
  caller headers the provider may see;
- ``upstream.py``: the :class:`Upstream` seam and the real :class:`HttpUpstream`; ``canned.py``:
  its canned twin for unit tests.

Configured routes (deployment groups, fallbacks, shared cooldowns) belong here beside
``routing.py``. Below ``_output``; it may import only ``_dialects``. docs/gateway.md, "Routing".
"""
