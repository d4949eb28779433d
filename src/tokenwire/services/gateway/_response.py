"""The streamed answer of one step, as a bare ASGI response over the step's outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenwire.services.gateway._outbox import Outbox


class StepStream(Response):
    """The response headers, then everything the outbox holds, one write per ``get``.

    Starlette's ``StreamingResponse`` runs each response in an anyio task group of two tasks
    to notice a caller that left; that cost ~0.3 ms of the time to first chunk and CPU on
    every response (bench/bench_gateway.py). Here one plain task waits for
    ``http.disconnect``. ``on_leave`` runs once when the caller leaves before the end.
    """

    media_type = "text/event-stream"

    def __init__(
        self, outbox: Outbox, headers: Mapping[str, str], on_leave: Callable[[], None]
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._outbox = outbox
        self._on_leave = on_leave
        self._left = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        watcher: asyncio.Future[None] | None = None
        completed = False
        try:
            await send(start)  # before the watcher starts: it is not on the way to the first bytes

            async def write(data: bytes) -> None:
                await send({"type": "http.response.body", "body": data, "more_body": True})

            self._outbox.attach(write, self._leave)
            watcher = asyncio.ensure_future(self._watch(receive))
            while (data := await self._outbox.get()) is not None:
                await self._outbox.write(data)
            if not self._outbox.detached:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                completed = True
        finally:
            if watcher is not None:
                watcher.cancel()
            if not completed:
                self._leave()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._leave()

    def _leave(self) -> None:
        if not self._left:
            self._left = True
            self._on_leave()
