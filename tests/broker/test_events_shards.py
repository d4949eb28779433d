"""The session events over R streams (they follow ``TOKENWIRE_REGISTRY_SHARDS``), on a real
nats-server: each session's events in the one stream its hash names and in no other, the
subject's shard token, and a broker's single events stream from before the events followed R
retired with its data kept (docs/operations.md, "The step registry's shards")."""

from __future__ import annotations

import dataclasses

import pytest
from nats.aio.client import Client
from nats.js.errors import NoStreamResponseError

from tests.fixtures.broker import TEST_MAX_BYTES, drop_topology, fresh_topology, provisioned
from tokenwire.broker import Topology, ensure_topology, stored_with_msg_id
from tokenwire.broker._api import api_request
from tokenwire.broker._provision import ensure_stream, side_stream_config

SESSIONS = [f"sess-e{i}" for i in range(12)]


def test_events_streams_and_subjects_follow_r() -> None:
    one = Topology(prefix="tw", events_stream="EV")
    four = Topology(prefix="tw", events_stream="EV", registry_shards=4)
    assert one.events_streams == ("EV",)
    assert four.events_streams == ("EV_R4_0", "EV_R4_1", "EV_R4_2", "EV_R4_3")
    # "abc" hashes to partition 11 of 16 (partition_of's doctest): 11 mod 4 = 3 of 4
    assert four.event_subject("abc") == "tw.events.3.abc.persisted"
    assert four.events_stream_of("abc") == "EV_R4_3"
    assert four.events_shard_subjects(3) == "tw.events.3.*.*"
    # R = 1: token 0, and the one stream keeps every event subject (older ones included)
    assert one.event_subject("abc", "started") == "tw.events.0.abc.started"
    assert one.events_shard_subjects(0) == "tw.events.>"
    # the events follow the registry (its bucket 3 of 4 too), not the chunk layout
    assert four.registry_bucket_of("abc") == "tokenwire-steps-r4-3"
    resharded = dataclasses.replace(four, shards=4, partitions=32)
    assert resharded.events_stream_of("abc") == "EV_R4_3"
    assert four.events_filter("started") == "tw.events.*.*.started"
    with pytest.raises(ValueError, match=r"events shard 4 outside 0\.\.3"):
        four.events_shard_stream(4)


async def test_each_session_s_events_land_in_its_own_stream_only(nc: Client) -> None:
    async with provisioned(nc, registry_shards=3) as t:
        configs = [await api_request(nc, f"$JS.API.STREAM.INFO.{s}") for s in t.events_streams]
        assert [c["config"]["subjects"] for c in configs] == [
            [f"{t.prefix}.events.{r}.*.*"] for r in range(3)
        ]
        assert {c["config"]["max_bytes"] for c in configs} == {TEST_MAX_BYTES // 8 // 3}
        js = nc.jetstream()
        for session in SESSIONS:
            ack = await js.publish(
                t.event_subject(session, "started"),
                b"{}",
                headers={"Nats-Msg-Id": f"started:{session}"},
            )
            assert ack.stream == t.events_stream_of(session)
        assert {t.events_stream_of(s) for s in SESSIONS} == set(t.events_streams)
        for stream in t.events_streams:
            info = await js.stream_info(stream, subjects_filter=">")
            mine = {
                t.event_subject(s, "started") for s in SESSIONS if t.events_stream_of(s) == stream
            }
            assert set(info.state.subjects or {}) == mine
        # the redelivery check reads the session's own stream, and only there finds it
        session = SESSIONS[0]
        subject, msg_id = t.event_subject(session, "started"), f"started:{session}"
        assert await stored_with_msg_id(nc, t.events_stream_of(session), subject, msg_id)
        other = next(s for s in t.events_streams if s != t.events_stream_of(session))
        assert not await stored_with_msg_id(nc, other, subject, msg_id)
        # the subject before the shard token is stored nowhere
        with pytest.raises(NoStreamResponseError):
            await js.publish(f"{t.prefix}.events.{session}.started", b"{}", timeout=1)


async def test_a_single_events_stream_from_before_is_retired_and_keeps_its_events(
    nc: Client,
) -> None:
    """A broker provisioned with R > 1 before the events followed R holds one events stream
    capturing ``<prefix>.events.>``: provisioning moves it off those subjects (it would
    overlap the R streams), its events readable until they age out."""
    t = fresh_topology(registry_shards=3)
    try:
        await ensure_stream(nc, side_stream_config(t, t.events_stream, f"{t.prefix}.events.>"))
        js = nc.jetstream()
        await js.publish(f"{t.prefix}.events.sess-old.persisted", b'{"old":1}')
        await ensure_topology(nc, t)
        legacy = await js.stream_info(t.events_stream)
        assert legacy.config.subjects == [f"{t.prefix}.retired.events.{t.events_stream}"]
        kept = await js.get_msg(t.events_stream, 1)
        assert (kept.subject, kept.data) == (f"{t.prefix}.events.sess-old.persisted", b'{"old":1}')
        ack = await js.publish(t.event_subject("sess-new"), b"{}")
        assert ack.stream == t.events_stream_of("sess-new")
        await ensure_topology(nc, t)  # idempotent: nothing to retire the second time
        assert (await js.stream_info(t.events_stream)).state.messages == 1
    finally:
        await drop_topology(nc, t)
