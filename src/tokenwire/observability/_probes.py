"""The services' metrics and probe server: ``wsgiref`` in a daemon thread, the machinery of
prometheus_client's own ``start_http_server``, with two probe paths added: ``/healthz`` (the
process answers) and ``/readyz`` (200 or 503, its body what the service says about itself).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the log."""


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def probe_app(registry: CollectorRegistry, ready: Callable[[], tuple[bool, str]]) -> WsgiApp:
    """``/healthz``, ``/readyz`` and, on every other path, the metrics. ``ready()`` says
    whether the instance is ready and the line ``/readyz`` answers with."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            ok, body = ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [body.encode()]
        result: Iterable[bytes] = metrics(environ, start_response)
        return result

    return app


class ProbeServer:
    """The metrics and probe HTTP server in a daemon thread; ``port`` is the bound port."""

    def __init__(self, host: str, port: int, app: WsgiApp) -> None:
        self._server = make_server(
            host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.port: int = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
