"""HeadWithBody (``_api/edge.py``): a response's head goes out in the same socket write as its
first body bytes, or alone at the event loop's next turn when no body follows at once."""

from __future__ import annotations

import asyncio

from tokenwire.services.gateway._api.edge import HeadWithBody


class Recorder(asyncio.Transport):
    """The socket's side: every write as it was made."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
BODY = b"5\r\nhello\r\n"


async def test_the_head_and_the_first_body_bytes_are_one_write_and_later_writes_pass():
    sock = Recorder()
    cycle = HeadWithBody(sock, asyncio.get_running_loop())
    cycle.write(HEAD)
    assert sock.writes == []  # held
    cycle.write(BODY)
    cycle.write(b"0\r\n\r\n")
    assert sock.writes == [HEAD + BODY, b"0\r\n\r\n"]
    await asyncio.sleep(0)  # the pending release finds nothing held
    assert sock.writes == [HEAD + BODY, b"0\r\n\r\n"]


async def test_a_head_without_a_body_in_the_same_turn_is_written_at_the_next_turn():
    sock = Recorder()
    cycle = HeadWithBody(sock, asyncio.get_running_loop())
    cycle.write(HEAD)
    await asyncio.sleep(0)
    assert sock.writes == [HEAD]
    cycle.write(BODY)
    assert sock.writes == [HEAD, BODY]


async def test_closing_writes_the_held_head_first():
    sock = Recorder()
    cycle = HeadWithBody(sock, asyncio.get_running_loop())
    cycle.write(HEAD)
    cycle.close()
    assert sock.writes == [HEAD]
    assert sock.closed
    assert cycle.is_closing()
    await asyncio.sleep(0)
    assert sock.writes == [HEAD]  # written once
