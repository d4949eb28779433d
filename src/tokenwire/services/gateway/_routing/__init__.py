"""Towards the provider: which provider a model goes to, and the call made to it.

- ``routing.py``: ``provider/model`` to a :class:`Route` (URL, dialect, credential);
- ``provider_call.py``: the provider's request (forwarded or translated); ``forward.py``: the
  caller headers the provider may see;
- ``upstream.py``: the :class:`Upstream` seam and the real :class:`HttpUpstream`; ``canned.py``:
  its canned twin for unit tests;
- the routes file's public names: ``routes_file.py`` (the file, checked), ``table.py`` (the
  routes in force, reloaded), ``plan.py`` (a request's picks: balancing, fallbacks),
  ``attempts.py`` (which failures before the first byte fall back), ``health.py`` (the
  deployments' shared cooldowns and load as this gateway sees them).

Below ``_output``; it may import only ``_dialects``. docs/gateway.md, "Routing" and "Routes".
"""
