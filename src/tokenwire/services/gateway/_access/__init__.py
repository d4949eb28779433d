"""Who calls and what it may touch: the gateway key, the session and step it names.

- ``keys.py``: gateway keys and their :class:`Caller` (tenant, name), what a caller may read;
- ``identity.py``: a request's (session, turn, step), from headers or assigned, and its claim;
- ``owners.py``: a named session belongs to the caller's tenant (else 404);
- ``browsers.py``: a keyless gateway answers only loopback ``Host`` and its own ``Origin``;
  model routes take only JSON.

Per-key limits and budgets, and keys held in the broker, belong here beside ``keys.py``.
Below ``_resume``; it may import ``_observe``, ``_output``, ``_routing`` and ``_dialects``.
docs/gateway.md, "Keys and tenants" and "Session identity".
"""
