"""Outbox: coalescing, writes by the step itself once attached, order, bounds, detach."""

from __future__ import annotations

import asyncio
import contextlib

from tokenwire.services.gateway._output.caller import Outbox


async def drain(outbox: Outbox) -> None:
    """What StepStream does: take what is buffered and write it, until the end."""
    while (data := await outbox.get()) is not None:
        await outbox.write(data)


async def test_without_a_writer_puts_coalesce_for_the_reader() -> None:
    outbox = Outbox(limit=1024)
    await outbox.put(b"a")
    await outbox.put(b"bc")
    outbox.close()
    assert await outbox.get() == b"abc"
    assert await outbox.get() is None


async def test_an_idle_attached_writer_is_written_by_the_producer() -> None:
    outbox, written = Outbox(limit=1024), []

    async def writer(data: bytes, last: bool) -> None:
        written.append(data)

    outbox.attach(writer, lambda: None)
    await outbox.put(b"a")
    await outbox.put(b"b")
    assert written == [b"a", b"b"]  # written in put, nothing left for the reader
    outbox.close()
    assert await outbox.get() is None


async def test_puts_during_a_slow_write_are_buffered_and_keep_their_order() -> None:
    outbox = Outbox(limit=1024)
    written: list[bytes] = []
    release = asyncio.Event()

    async def slow_writer(data: bytes, last: bool) -> None:
        if not written:
            await release.wait()  # the caller's connection is busy
        written.append(data)

    outbox.attach(slow_writer, lambda: None)
    first = asyncio.create_task(outbox.put(b"1"))
    await asyncio.sleep(0)
    reader = asyncio.create_task(drain(outbox))
    await outbox.put(b"2")  # a write is in progress: buffered
    await outbox.put(b"3")
    release.set()
    await first
    outbox.close()
    await asyncio.wait_for(reader, 5)
    assert b"".join(written) == b"123"
    assert written == [b"1", b"23"]  # what waited went out as one write


async def test_over_the_limit_the_producer_waits_for_the_reader() -> None:
    outbox = Outbox(limit=4)
    release = asyncio.Event()

    async def stuck(data: bytes, last: bool) -> None:
        await release.wait()

    outbox.attach(stuck, lambda: None)
    writing = asyncio.create_task(outbox.put(b"0"))  # the step's own write, stuck
    await asyncio.sleep(0)
    await outbox.put(b"abc")
    blocked = asyncio.create_task(outbox.put(b"defg"))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    release.set()
    await writing
    assert await outbox.get() == b"abcdefg"
    await asyncio.wait_for(blocked, 5)


async def test_before_the_response_starts_nothing_waits_for_room() -> None:
    """The first read is put by the task that will start the response: it must not wait."""
    outbox = Outbox(limit=4)
    await asyncio.wait_for(outbox.put(b"far more than four bytes"), 1)
    assert await outbox.get() == b"far more than four bytes"


async def test_a_writer_that_raises_is_a_caller_gone() -> None:
    outbox, gone = Outbox(limit=1024), []

    async def closed(data: bytes, last: bool) -> None:
        raise ConnectionResetError("the caller is gone")

    outbox.attach(closed, lambda: gone.append(True))
    await outbox.put(b"a")  # does not raise into the step
    await outbox.put(b"b")
    assert outbox.detached
    assert gone == [True]
    assert await outbox.get() is None


async def test_a_write_cancelled_midway_goes_back_for_the_reader() -> None:
    outbox = Outbox(limit=1024)
    started = asyncio.Event()

    async def slow(data: bytes, last: bool) -> None:
        started.set()
        await asyncio.sleep(10)

    outbox.attach(slow, lambda: None)
    writing = asyncio.create_task(outbox.put(b"batch"))  # nothing waits: written directly
    await started.wait()
    writing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writing
    outbox.close()
    assert await outbox.get() == b"batch"
    assert await outbox.get() is None


async def test_after_detach_everything_is_dropped() -> None:
    outbox = Outbox(limit=4)
    await outbox.put(b"abc")
    blocked = asyncio.create_task(outbox.put(b"defg"))
    await asyncio.sleep(0)
    outbox.detach()
    await asyncio.wait_for(blocked, 5)
    await outbox.put(b"more")
    assert outbox.detached
    assert await outbox.get() is None


async def test_the_bytes_it_ends_with_are_written_as_the_last() -> None:
    """``end``: the producer does not write them itself, even with the writer idle; the reader
    gets them with ``ended`` set, to send them with the end of the body."""
    outbox, written = Outbox(limit=4), []

    async def writer(data: bytes, last: bool) -> None:
        written.append((data, last))

    outbox.attach(writer, lambda: None)
    await outbox.put(b"chunks")
    outbox.end(b"[DONE] and more than four bytes")  # no room is waited for
    assert written == [(b"chunks", False)]
    assert await outbox.get() == b"[DONE] and more than four bytes"
    assert outbox.ended
    assert await outbox.get() is None


async def test_end_after_detach_keeps_nothing() -> None:
    outbox = Outbox(limit=1024)
    outbox.detach()
    outbox.end(b"[DONE]")
    assert await outbox.get() is None


async def test_put_now_writes_through_the_servers_write_when_nothing_waits() -> None:
    outbox, sent, now_written = Outbox(limit=1024), [], []

    async def writer(data: bytes, last: bool) -> None:
        sent.append(data)

    def now(data: bytes) -> bool:
        now_written.append(data)
        return data != b"full"  # the server's socket is full for this one

    assert not outbox.put_now(b"a")  # not attached: the reader takes it from put
    outbox.attach(writer, lambda: None, now)
    assert outbox.put_now(b"b")
    assert now_written == [b"b"]
    assert not outbox.put_now(b"full")  # refused: nothing buffered, put writes it
    await outbox.put(b"full")
    assert sent == [b"full"]
    assert not outbox.ended


async def test_put_now_never_overtakes_buffered_bytes() -> None:
    outbox, now_written = Outbox(limit=1024), []

    async def writer(data: bytes, last: bool) -> None:
        pass

    def now(data: bytes) -> bool:
        now_written.append(data)
        return True

    outbox.attach(writer, lambda: None, now)
    await outbox.put(b"a")  # written by the producer (through the writer)
    outbox._buffer += b"held"  # as a put during a slow write leaves it
    assert not outbox.put_now(b"b")  # behind what is held: through put, in order
    assert now_written == []


async def test_put_now_after_the_caller_left_or_a_raising_write_drops_the_bytes() -> None:
    outbox, gone = Outbox(limit=1024), []

    def broken(data: bytes) -> bool:
        raise ConnectionResetError

    async def writer(data: bytes, last: bool) -> None:
        raise AssertionError("not reached")

    outbox.attach(writer, lambda: gone.append(True), broken)
    assert outbox.put_now(b"a")  # the write raised: the caller is gone, nothing to retry
    assert outbox.detached
    assert gone == [True]
    assert outbox.put_now(b"b")  # dropped
