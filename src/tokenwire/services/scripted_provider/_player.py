"""The ASGI response that performs a plan: paced sends, stalls and aborted connections."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import assert_never

import anyio
from starlette.types import Receive, Scope, Send

from tokenwire.services.scripted_provider._actions import Abort, Action, Emit, Stall

_ABORTING: ContextVar[bool] = ContextVar("scripted_provider_aborting", default=False)
_UVICORN_INCOMPLETE = "ASGI callable returned without completing response"


class _ScriptedAbortFilter(logging.Filter):
    """Silences uvicorn's error line for responses this provider aborts on purpose.

    uvicorn closes the connection when an app returns mid-body, which is exactly the ``drop``
    scenario, and logs it as an error; the context variable limits the silence to those
    requests, so another app's incomplete response in the same process is still reported.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_ABORTING.get() and str(record.msg).startswith(_UVICORN_INCOMPLETE))


def install_abort_filter() -> None:
    """Attach the filter to uvicorn's error logger once."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ScriptedAbortFilter) for f in logger.filters):
        logger.addFilter(_ScriptedAbortFilter())


class PlayedResponse:
    """Sends ``actions`` as one HTTP response.

    ``Emit(paced=True)`` sends are spaced ``1 / token_rate`` seconds apart (no wait when the
    rate is 0); a ``Stall`` waits, cut short by ``closing``; ``Abort`` (or ``closing`` being
    set) closes the connection without finishing the body. A client disconnect cancels the
    playback at once, so a stalled stream never outlives its caller.
    """

    def __init__(
        self,
        actions: Iterable[Action],
        *,
        status: int,
        headers: Mapping[str, str],
        token_rate: float,
        closing: asyncio.Event,
    ) -> None:
        self.actions = actions
        self.status = status
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.pacer = Pacer(token_rate)
        self.closing = closing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        finished = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
            finished = await self._play(send)
            tg.cancel_scope.cancel()
        if finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            _ABORTING.set(True)  # returning mid-body makes uvicorn close the connection

    async def _play(self, send: Send) -> bool:
        """Perform the actions; ``False`` when the connection must be aborted."""
        for action in self.actions:
            match action:
                case Emit(data=data, paced=paced):
                    if paced:
                        await self.pacer.wait()
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                case Stall(seconds=seconds):
                    with anyio.move_on_after(seconds):
                        await self.closing.wait()
                    self.pacer.restart()
                case Abort():
                    return False
                case _:
                    assert_never(action)
            if self.closing.is_set():
                return False
        return True


class Pacer:
    """Spaces paced sends ``1 / token_rate`` apart on a schedule, so slow sends do not drift.

    The first send (and the first after :meth:`restart`) goes at once; a rate of 0 never waits.
    """

    def __init__(
        self,
        token_rate: float,
        *,
        now: Callable[[], float] = anyio.current_time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.interval = 1 / token_rate if token_rate > 0 else 0.0
        self._now = now
        self._sleep = sleep
        self._next_at: float | None = None

    async def wait(self) -> None:
        """Wait for the next send's turn."""
        if not self.interval:
            return
        now = self._now()
        if self._next_at is None:
            self._next_at = now
            return
        self._next_at += self.interval
        if self._next_at > now:
            await self._sleep(self._next_at - now)

    def restart(self) -> None:
        """Start a new schedule (after a stall): the next send goes at once."""
        self._next_at = None


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
