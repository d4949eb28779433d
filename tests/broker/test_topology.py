"""Names and the partition function, checked against FNV-1a test vectors and the real server."""

from __future__ import annotations

import random
import string

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import (
    Topology,
    chunk_subject,
    ensure_topology,
    fnv1a32,
    msg_id,
    parse_stored_subject,
    stored_subject,
    valid_session,
)


@pytest.mark.parametrize(
    ("data", "expected"),
    # Reference vectors of the FNV-1a 32-bit hash (Fowler/Noll/Vo test suite).
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],
)
def test_fnv1a32_matches_reference_vectors(data: bytes, expected: int) -> None:
    assert fnv1a32(data) == expected


def test_names_derive_from_the_topology() -> None:
    t = Topology(prefix="x", partitions=16)
    assert chunk_subject(t, "abc", first=True) == "x.in.abc.first"
    assert chunk_subject(t, "abc", first=False) == "x.in.abc.next"
    assert stored_subject(t, "abc", first=True) == "x.chunks.11.abc.first"
    assert t.session_filter("abc") == "x.chunks.11.abc.*"
    assert msg_id("abc", 2, 3, 17) == "abc:2:3:17"
    assert parse_stored_subject(t, "x.chunks.11.abc.next") == (11, "abc", False)
    with pytest.raises(ValueError, match="not a chunk subject"):
        parse_stored_subject(t, "x.events.abc.next")


def test_session_ids_are_one_subject_token() -> None:
    assert valid_session("Ab-9_z")
    assert not valid_session("a.b")
    assert not valid_session("")
    assert not valid_session("x" * 129)


@pytest.mark.parametrize("partitions", [16, 7])
async def test_partition_of_equals_the_servers_mapping(nc: Client, partitions: int) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "-_"
    sessions = {"".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(300)}
    t = fresh_topology(partitions=partitions)
    await ensure_topology(nc, t)
    js = nc.jetstream()
    try:
        for session in sessions:
            ack = await js.publish(chunk_subject(t, session, first=True), b"x")
            stored = await js.get_msg(t.stream, ack.seq)
            assert stored.subject == stored_subject(t, session, first=True), session
    finally:
        await drop_topology(nc, t)


def test_public_names_are_exported_once() -> None:
    from tokenwire import broker

    public = {n for n in dir(broker) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(broker.__all__)
    for name in broker.__all__:
        assert getattr(broker, name) is not None, name
    assert len(set(broker.__all__)) == len(broker.__all__)
