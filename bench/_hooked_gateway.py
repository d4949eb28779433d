"""``tokenwire gateway`` with bench-only hooks, chosen by environment (never used in service):

- ``TW_BENCH_CLIENT=aiohttp``: provider calls through aiohttp instead of ``HttpClient``
  (ADR 0009's comparison on the full stack);
- ``TW_BENCH_MARKS=<file>``: per-request timing marks (CLOCK_MONOTONIC, shared by every process
  on the machine) appended to ``<file>`` as JSON lines, for the lone-caller breakdown;
- ``TW_BENCH_PROFILE=<file>``: the gateway under cProfile (CPU time), its stats written to
  ``<file>`` at exit.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import aiohttp

from tokenwire.broker import ChunkPublisher, StepRegistry
from tokenwire.providers import _http, _stream
from tokenwire.services.gateway._access.identity import StepClaim
from tokenwire.services.gateway._access.owners import SessionGuard
from tokenwire.services.gateway._api.app import Gateway, GatewayApp
from tokenwire.services.gateway._output.caller import Outbox, StepStream
from tokenwire.services.gateway._steps.step import StepRun


class _AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._r = response
        self.status = response.status
        self.reason = response.reason
        self.headers = {k.lower(): v for k, v in response.headers.items()}

    async def read(self) -> bytes:
        return await self._r.content.readany()

    async def read_up_to(self, limit: int) -> bytes:
        return (await self._r.content.read(limit)) or b""

    def release(self) -> None:
        self._r.release()


class _LazyPost:
    """What ``SentRequest`` needs of ``HttpClient.send``'s pending post, over aiohttp."""

    def __init__(self, client: AiohttpClient, url: str, body: bytes, headers: dict[str, str]):
        self._post = (client, url, body, headers)

    async def response(self) -> _AiohttpResponse:
        client, url, body, headers = self._post
        return await client.post(url, body, headers)

    def cancel(self) -> None:
        pass


class AiohttpClient:
    """What ``ProviderSession`` needs of ``HttpClient``, on one pooled aiohttp session."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._session: aiohttp.ClientSession | None = None

    def send(self, url: str, body: bytes, headers: dict[str, str]) -> _LazyPost:
        """aiohttp cannot write a request without awaiting: sent when the answer is awaited."""
        return _LazyPost(self, url, body, headers)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> _AiohttpResponse:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        response = await self._session.post(url, data=body, headers=headers)
        return _AiohttpResponse(response)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


_marks: dict[str, float] = {}


def _mark(name: str) -> None:
    _marks.setdefault(name, time.perf_counter())


def _wrap_sync(cls: Any, attr: str, before: str) -> None:
    original = getattr(cls, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _mark(before)
        return original(*args, **kwargs)

    setattr(cls, attr, wrapped)


def _wrap_async(cls: Any, attr: str, before: str, after: str | None = None) -> None:
    original = getattr(cls, attr)

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        _mark(before)
        result = await original(*args, **kwargs)
        if after:
            _mark(after)
        return result

    setattr(cls, attr, wrapped)


def _install_marks(path: str) -> None:
    original_call = GatewayApp.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await original_call(self, scope, receive, send)
            return
        _marks.clear()
        _mark("app_entry")

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                _mark("first_body_send")
            await send(message)
            if message["type"] == "http.response.body" and message.get("body"):
                _mark("first_body_sent")
            if message["type"] == "http.response.body" and not message.get("more_body"):
                with open(path, "a") as out:  # noqa: ASYNC230 - after the response, bench only
                    out.write(json.dumps(_marks) + "\n")

        await original_call(self, scope, receive, timed_send)

    # Bench-only instrumentation: a patched method is what the timing marks measure.
    GatewayApp.__call__ = call  # type: ignore[method-assign]  # the hook: timing marks around the app, bench only
    _wrap_async(Gateway, "_read_body", "body_read_start", "body_read")
    _wrap_async(Gateway, "_thread", "thread_start", "thread_done")
    _wrap_async(SessionGuard, "admit", "admit_start", "admit_done")
    _wrap_async(StepRegistry, "begin_next_step", "claim_start", "claim_sent")
    _wrap_async(StepRun, "begin", "step_begin", "step_begun")
    _wrap_async(StepRun, "_take", "first_take")
    take = StepRun._take

    async def counted_take(self: Any, batch: Any) -> None:
        _marks.setdefault("first_read_chunks", len(batch))
        await take(self, batch)

    StepRun._take = counted_take  # type: ignore[method-assign]  # bench only: the first read's size
    _wrap_async(ChunkPublisher, "publish", "first_publish", "first_published")
    _wrap_async(Outbox, "put", "first_outbox_put")
    _wrap_async(StepStream, "__call__", "response_call")
    _wrap_async(StepClaim, "identity", "claim_wait", "claim_known")
    client = _stream.HttpClient
    _wrap_sync(client, "send", "provider_post")
    if client is _http.HttpClient:
        _wrap_async(_http.PendingPost, "response", "provider_wait", "provider_headers")
        _wrap_async(_http.HttpResponse, "read", "first_read_call", "first_read_done")
    else:
        _wrap_async(_LazyPost, "response", "provider_wait", "provider_headers")
        _wrap_async(_AiohttpResponse, "read", "first_read_call", "first_read_done")


def main() -> int:
    if os.environ.get("TW_BENCH_CLIENT") == "aiohttp":
        # Bench-only: the same gateway with aiohttp for provider calls (ADR 0009's A/B).
        _stream.HttpClient = AiohttpClient  # type: ignore[misc, assignment]
    if marks := os.environ.get("TW_BENCH_MARKS"):
        _install_marks(marks)
    from tokenwire.cli import main as cli

    if profile := os.environ.get("TW_BENCH_PROFILE"):
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        try:
            return profiler.runcall(cli, ["gateway"])
        finally:
            profiler.dump_stats(profile)
    return cli(["gateway"])


if __name__ == "__main__":
    raise SystemExit(main())
