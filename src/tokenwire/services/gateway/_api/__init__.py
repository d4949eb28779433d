"""The gateway's HTTP surface: the app and its routes, the server, the settings.

- ``app.py``: the Starlette app (:class:`Gateway`), its routes and the checks of a model call,
  in order; ``server.py``: the app served for real (broker, uvicorn; ``tokenwire gateway``);
- ``edge.py``: the socket's bounds, in uvicorn's protocol before the app runs;
- ``settings.py``: everything the gateway reads from the environment, as one value;
- one module per side route: ``catalog.py`` (``GET /v1/models``), ``usage.py``
  (``GET /v1/usage``), ``retrieve.py`` (``GET /v1/responses/{id}``), ``count_tokens.py``
  (``POST /v1/messages/count_tokens``), ``openapi.py`` (``GET /openapi.json``).

The top room: it may import every other room. Endpoints: docs/gateway.md.
"""
