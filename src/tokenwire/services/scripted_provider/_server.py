"""Serving the scripted provider with uvicorn, on a fixed port or a free one (port 0)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import sys
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Self

import uvicorn

from tokenwire.services.scripted_provider._app import ReceivedRequest, ScriptedProvider
from tokenwire.services.scripted_provider._errors import ScriptedProviderError
from tokenwire.services.scripted_provider._settings import ScriptedSettings

STARTUP_TIMEOUT_S = 10.0
"""How long ``ScriptedServer`` waits for uvicorn to accept connections before giving up."""
SHUTDOWN_GRACE_S = 5
"""How long shutdown waits for open responses before uvicorn cancels them."""


class ServerStartError(ScriptedProviderError):
    """The server could not bind ``host:port`` or did not start in time."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"scripted provider could not start on {host}:{port}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason


class _QuietSignals(uvicorn.Server):
    """uvicorn without its signal handlers: an embedded server leaves signals to its host."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ScriptedServer:
    """The scripted provider on a real socket, for tests, the demo and the CLI.

    ``port=0`` binds a free port; ``url`` (``http://host:port``) is valid inside the block.
    Leaving the block closes stalled streams and stops the server. Example::

        async with ScriptedServer(ScriptedSettings(seed=7)) as server:
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x")
    """

    def __init__(
        self,
        settings: ScriptedSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        handle_signals: bool = False,
    ) -> None:
        self.provider = ScriptedProvider(settings or ScriptedSettings(), clock)
        self.host = host
        self.port = port
        self._handle_signals = handle_signals
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def received(self) -> collections.deque[ReceivedRequest]:
        """The latest requests the provider received, oldest first (bounded)."""
        return self.provider.received

    @property
    def url(self) -> str:
        """The base URL, without ``/v1`` (OpenAI clients add it, Anthropic clients do not)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def __aenter__(self) -> Self:
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.provider.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        server_type = uvicorn.Server if self._handle_signals else _QuietSignals
        self._server = server_type(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        await self._wait_started()
        return self

    async def _wait_started(self) -> None:
        assert self._server is not None
        assert self._task is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                await self.close()
                raise ServerStartError(self.host, self.port, "uvicorn did not start")
            await asyncio.sleep(0.01)

    async def wait_closed(self) -> None:
        """Return when the server stops (a signal, when it handles them, or :meth:`close`)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Close stalled streams, stop accepting, and wait for uvicorn to finish."""
        self.provider.closing.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(SystemExit):  # uvicorn exits the process on a bind error
                await self._task

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket; bound here so a busy port is our error, not uvicorn's exit."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as exc:
        raise ServerStartError(host, port, exc.strerror or str(exc)) from exc
    # Accepted connections inherit TCP_NODELAY from the listener. asyncio sets it itself only
    # on sockets whose ``proto`` is IPPROTO_TCP, which ``create_server`` sockets are not: without
    # it Nagle held each response's first body bytes behind the unacknowledged headers until
    # the client's delayed ACK (~40 ms per request, bench/bench_gateway.py).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def serve(
    host: str,
    port: int,
    settings: ScriptedSettings,
    *,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM or cancellation; ``on_ready(url)`` once it accepts requests."""
    async with ScriptedServer(settings, host=host, port=port, handle_signals=True) as server:
        if on_ready is not None:
            on_ready(server.url)
        await server.wait_closed()


async def run(host: str, port: int, settings: ScriptedSettings) -> None:
    """The CLI entry: serve, printing ``scripted-provider: <url>`` once ready."""

    def announce(url: str) -> None:
        print(f"scripted-provider: {url}", file=sys.stdout, flush=True)

    await serve(host, port, settings, on_ready=announce)
