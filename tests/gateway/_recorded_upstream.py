"""A loopback HTTP server playing the ``openai-responses`` and ``gemini`` upstreams with real
recorded streams, byte for byte, read from the recordings folder (never copied here).

The gateway reaches it through its base-URL settings (``TOKENWIRE_OPENAI_RESPONSES_BASE_URL``,
``TOKENWIRE_GEMINI_BASE_URL``), as it would reach the provider. Which recording answers is
chosen by the request's model (``openai-responses/<scenario>`` names it in the body,
``gemini/<scenario>`` in the path), so one server serves every case of a module. It runs on
its own thread (one per module, whatever the tests' event loops), counts every request it
answers, and is bounded: a request body over ``MAX_BODY`` bytes, or more than
``MAX_REQUESTS`` requests, is answered 413 / 503 and counted as refused.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RESPONSES_PATH = "/v1/responses"
GEMINI_PREFIX = "/v1beta/models/"
GEMINI_SUFFIX = ":streamGenerateContent?alt=sse"
MAX_BODY = 1 << 20
MAX_REQUESTS = 500


@dataclass(frozen=True)
class Received:
    """One request the upstream answered: its dialect, path, headers and body."""

    dialect: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class RecordedUpstream:
    """The server's state: recordings by (dialect, scenario), and what it received."""

    recordings: Mapping[tuple[str, str], Path]
    received: list[Received] = field(default_factory=list)
    refused: int = 0
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def calls(self, dialect: str) -> int:
        """How many requests of ``dialect`` were answered so far."""
        with self._lock:
            return sum(1 for r in self.received if r.dialect == dialect)

    def answer(self, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """(status, body) for one request; recorded when answered with a recording."""
        found = self._recording(path, body)
        if found is None:
            return 404, b'{"error": {"message": "no recording for this request"}}'
        dialect, recording = found
        with self._lock:
            if len(self.received) >= MAX_REQUESTS:
                self.refused += 1
                return 503, b'{"error": {"message": "the recorded upstream is past its bound"}}'
            self.received.append(Received(dialect, path, dict(headers), body))
        return 200, recording.read_bytes()

    def _recording(self, path: str, body: bytes) -> tuple[str, Path] | None:
        if path == RESPONSES_PATH:
            try:
                model = json.loads(body).get("model", "")
            except (ValueError, AttributeError):
                return None
            dialect = "openai-responses"
        elif path.startswith(GEMINI_PREFIX) and path.endswith(GEMINI_SUFFIX):
            model = urllib.parse.unquote(path[len(GEMINI_PREFIX) : -len(GEMINI_SUFFIX)])
            dialect = "gemini"
        else:
            return None
        recording = self.recordings.get((dialect, model))
        return None if recording is None else (dialect, recording)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        state = self.server.state
        if length > MAX_BODY:
            with state._lock:
                state.refused += 1
            self._reply(413, b"{}", "application/json")
            return
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = state.answer(self.path, headers, body)
        kind = "text/event-stream; charset=utf-8" if status == 200 else "application/json"
        self._reply(status, answer, kind)

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(body)  # the recording's bytes, as recorded
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the test output is the report


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: RecordedUpstream) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


@contextmanager
def recorded_upstream(recordings: Mapping[tuple[str, str], Path]) -> Iterator[RecordedUpstream]:
    """The server, started on a free loopback port (``state.url``), stopped at the end."""
    state = RecordedUpstream(recordings)
    server = _Server(state)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="recorded-upstream", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
