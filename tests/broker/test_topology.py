"""Names and the partition function, checked against FNV-1a test vectors and the real server."""

from __future__ import annotations

import random
import string

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import fresh_topology
from tokenwire.broker import (
    Topology,
    chunk_subject,
    fnv1a32,
    jetstream_request,
    msg_id,
    parse_stored_subject,
    partition_of,
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
    assert chunk_subject(t, "abc", first=True) == "x.chunks.11.abc.first"
    assert chunk_subject(t, "abc", first=False) == "x.chunks.11.abc.next"
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
    """The oracle: a throwaway stream whose subject transform is the server's own
    ``{{partition(n,1)}}`` files each session; ``partition_of`` must name the same partition
    (the gateway publishes straight to the partition it computes)."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "-_"
    sessions = {"".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(300)}
    t = fresh_topology(partitions=partitions)
    oracle = f"ORACLE_{t.stream}"
    source = f"{t.prefix}.oracle.*"
    dest = f"{t.prefix}.mapped.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}"
    await jetstream_request(
        nc,
        f"$JS.API.STREAM.CREATE.{oracle}",
        {
            "name": oracle,
            "subjects": [source],
            "storage": "memory",
            "subject_transform": {"src": source, "dest": dest},
        },
    )
    js = nc.jetstream()
    try:
        for session in sessions:
            ack = await js.publish(f"{t.prefix}.oracle.{session}", b"x")
            stored = await js.get_msg(oracle, ack.seq)
            assert (
                stored.subject == f"{t.prefix}.mapped.{partition_of(session, partitions)}.{session}"
            )
    finally:
        await js.delete_stream(oracle)


@pytest.mark.parametrize("partitions", range(1, 41))
def test_shards_own_the_contiguous_partition_ranges(partitions: int) -> None:
    """Shard k owns [k*P//K, (k+1)*P//K), written out from the definition for every K <= P."""
    for shards in range(1, partitions + 1):
        t = Topology(partitions=partitions, shards=shards)
        owner = {}
        for k in range(shards):
            for p in range(k * partitions // shards, (k + 1) * partitions // shards):
                owner[p] = k
        assert sorted(owner) == list(range(partitions))  # every partition, exactly once
        assert [t.shard_of_partition(p) for p in range(partitions)] == [
            owner[p] for p in range(partitions)
        ]
        assert [list(t.shard_partitions(k)) for k in range(shards)] == [
            [p for p in range(partitions) if owner[p] == k] for k in range(shards)
        ]


def test_stream_names_encode_the_layout() -> None:
    one = Topology(partitions=16)
    assert one.chunk_streams == ("TOKENWIRE",)  # an existing broker keeps its stream
    assert one.stream_of("abc") == one.stream_of_partition(11) == "TOKENWIRE"
    four = Topology(partitions=16, shards=4)
    assert four.chunk_streams == tuple(f"TOKENWIRE_K4_P16_S{k}" for k in range(4))
    assert four.stream_of("abc") == "TOKENWIRE_K4_P16_S2"  # partition 11 of 0-3|4-7|8-11|12-15
    assert four.shard_subjects(2) == [f"tw.chunks.{p}.*.*" for p in (8, 9, 10, 11)]
    assert Topology(partitions=32, shards=4).chunk_streams[0] == "TOKENWIRE_K4_P32_S0"
    assert four.shard_max_bytes == four.max_bytes // 4
    for bad in ({"shards": 0}, {"shards": 17}, {"compression": "zstd"}):
        with pytest.raises(ValueError, match=r"shards|compression"):
            Topology(partitions=16, **bad)


def test_public_names_are_exported_once() -> None:
    from tokenwire import broker

    public = {n for n in dir(broker) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(broker.__all__)
    for name in broker.__all__:
        assert getattr(broker, name) is not None, name
    assert len(set(broker.__all__)) == len(broker.__all__)
