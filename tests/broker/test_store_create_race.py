"""nats-server 2.15.1 fails a stream create that races the deletion of the account's last
stream (``error creating store for stream``, err_code 10049); ``ensure_stream`` tries it
again (bounded), so provisioning right after a topology was dropped never fails on it.

The server is a fresh one of this test's own (the shared one keeps an anchor stream alive,
which hides the race). The oracle is the server itself: without the retry these rounds fail
(4 in 700 when measured), with it none may.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tokenwire.broker import EmbeddedServer, connect
from tokenwire.broker._provision import ensure_stream

ROUNDS = 400


async def test_a_create_right_after_the_last_stream_was_deleted_is_tried_again(
    tmp_path: Path,
) -> None:
    async with EmbeddedServer(tmp_path) as server:
        nc = await connect(server.url)
        try:
            js = nc.jetstream()
            for _ in range(ROUNDS):
                name = f"RACE_{uuid.uuid4().hex[:8]}"
                await ensure_stream(nc, {"name": name, "subjects": [f"race.{name}"]})
                assert (await js.stream_info(name)).config.name == name
                await js.delete_stream(name)
        finally:
            await nc.close()
