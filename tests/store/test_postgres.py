"""PostgreSQL only: losing the server, and getting it back with the same store object.

The server is reached through a small TCP proxy on a free port, so a test can make the
"database" vanish (connection refused, connections cut) and come back on the same address.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import urllib.parse

import psycopg
import pytest

from tokenwire.schemas import ChunkEvent
from tokenwire.store import StoreUnavailable, open_store

from .builders import message_record

pytestmark = pytest.mark.postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Proxy:
    """Forwards 127.0.0.1:``port`` to the real server; ``stop()`` refuses and cuts."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self._target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(*p)) for p in ((reader, up_writer), (up_reader, writer))
        ]
        self._tasks.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()


def via_port(url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


def target_of(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return (parts.hostname or "127.0.0.1", parts.port or 5432)


async def test_unreachable_server_is_unavailable_and_the_store_recovers(pg_url: str) -> None:
    proxy = Proxy(free_port(), target_of(pg_url))
    store = open_store(via_port(pg_url, proxy.port))
    try:
        with pytest.raises(StoreUnavailable) as info:  # nothing listens on the port yet
            await store.ping()
        assert info.value.backend == "postgresql"
        await proxy.start()
        [a] = await store.commit([message_record("s", 0, 0, 3)])
        assert (a.seq_start, a.seq_end, a.inserted) == (1, 3, True)
        await store.session_events("s")

        await proxy.stop()  # the database vanishes: connections cut, new ones refused
        with pytest.raises(StoreUnavailable):
            await store.commit([message_record("s", 0, 1, 2)])
        with pytest.raises(StoreUnavailable):
            await store.session_events("s")

        await proxy.start()  # back on the same address: the same object reconnects
        [again, b] = await store.commit(
            [message_record("s", 0, 0, 3), message_record("s", 0, 1, 2)]
        )
        assert (again.inserted, b.seq_start, b.seq_end, b.inserted) == (False, 4, 5, True)
        events = await store.session_events("s")
        assert [e.seq for e in events if isinstance(e, ChunkEvent)] == [1, 2, 3, 4, 5]
    finally:
        await store.close()
        with contextlib.suppress(AssertionError):
            await proxy.stop()


async def test_killed_connections_are_unavailable_once_then_replaced(pg_url: str) -> None:
    name = f"tw_kill_{secrets.token_hex(4)}"
    url = f"{pg_url}&application_name={name}"
    store = open_store(url)
    try:
        await store.commit([message_record("s", 0, 0, 1)])
        await store.session_events("s")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE application_name = %s",
                (name,),
            ).fetchone()
        assert killed == (2,)  # the writer and the reader
        with pytest.raises(StoreUnavailable) as info:
            await store.commit([message_record("s", 0, 1, 1)])
        assert info.value.backend == "postgresql"
        [b] = await store.commit([message_record("s", 0, 1, 1)])
        assert (b.seq_start, b.inserted) == (2, True)
        with pytest.raises(StoreUnavailable):
            await store.messages("s")
        assert len(await store.messages("s")) == 2
    finally:
        await store.close()


async def test_a_database_that_does_not_exist_is_unavailable(pg_server: str) -> None:
    parts = urllib.parse.urlsplit(pg_server)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/tw_missing_{secrets.token_hex(4)}"))
    store = open_store(url)
    try:
        with pytest.raises(StoreUnavailable, match="does not exist"):
            await store.ping()
    finally:
        await store.close()
