"""``tokenwire rebuild`` against a real nats-server and store: equal to the assembler's store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from tokenwire.broker import ChunkPublisher, Topology
from tokenwire.cli._rebuild import rebuild_store
from tokenwire.ledger import StepUsage
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    StepError,
    StreamChunk,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    Usage,
    json_encoder,
)
from tokenwire.services.assembler import AssemblerSettings, AssemblyConfig, run
from tokenwire.store import open_store

HOUR_NS = 3600 * 10**9
"""How long before the rebuild's clock the old, abandoned step streamed."""

STEPS: dict[tuple[str, int, int], list[StreamChunk]] = {
    ("rb-a", 0, 0): [
        TextDelta(index=0, text="hello "),
        TextDelta(index=0, text="world"),
        Usage(usage=TokenUsage(input_tokens=3, output_tokens=2)),
        Finish(reason="stop"),
    ],
    ("rb-a", 0, 1): [
        ToolCallDelta(index=0, id="c1", name="f", arguments_delta='{"x"'),
        ToolCallDelta(index=0, id="c1", arguments_delta=": 1}"),
        Finish(reason="tool-calls"),
    ],
    ("rb-b", 0, 0): [
        TextDelta(index=0, text="partial"),
        Finish(reason="error", error=StepError(message="overloaded", retryable=True)),
    ],
    ("rb-b", 1, 0): [TextDelta(index=0, text="later turn"), Finish(reason="stop")],
}
STILL_STREAMING = ("rb-live", 0, 0)
OLD_ABANDONED = ("rb-old", 0, 0)


async def _publish(nc: Client, t: Topology) -> int:
    """Publish the plan; returns the time (ns) its chunks are stamped with: the clock a rebuild
    is given, so that "still streaming" and "abandoned" do not depend on how slow the test is."""
    now = time.time_ns()
    publisher = await ChunkPublisher(nc, t).start()
    plan = [(key, chunks, now) for key, chunks in STEPS.items()]
    plan += [(STILL_STREAMING, [TextDelta(index=0, text="still going")], now)]
    plan += [(OLD_ABANDONED, [TextDelta(index=0, text="gateway died")], now - HOUR_NS)]
    for (session, turn, step), chunks, t0 in plan:
        for ordinal, chunk in enumerate(chunks):
            env = ChunkEnvelope(
                session=session,
                turn=turn,
                step=step,
                ordinal=ordinal,
                time_ns=t0 + ordinal,
                provider="scripted",
                model="m",
                chunk=chunk,
            )
            await publisher.publish(
                json_encoder.encode(env), session, turn, step, ordinal, first=ordinal == 0
            )
    await publisher.flush(30)
    await publisher.close()
    return now


async def _events(url: str, sessions: list[str]) -> dict[str, list[object]]:
    store = open_store(url)
    try:
        return {s: list(await store.session_events(s)) for s in sessions}
    finally:
        await store.close()


async def _lines(url: str, sessions: list[str]) -> dict[str, list[StepUsage]]:
    store = open_store(url)
    try:
        return {s: list(await store.session_usage(s)) for s in sessions}
    finally:
        await store.close()


async def test_rebuild_into_an_empty_store_equals_the_assembler_store(
    nc: Client, nats_url: str, topology: Topology, tmp_path: Path
) -> None:
    now = await _publish(nc, topology)
    assembled, rebuilt = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    settings = AssemblerSettings(
        nats_urls=(nats_url,),
        store_url=assembled,
        topology=topology,
        burst=True,
        metrics_addr=None,
        provision=False,
    )
    await run(settings)

    store = open_store(rebuilt)
    try:
        report, past = await rebuild_store(
            nc, topology, store, None, AssemblyConfig(), now=lambda: now
        )
        again, _ = await rebuild_store(nc, topology, store, None, AssemblyConfig(), now=lambda: now)
    finally:
        await store.close()

    complete = ["rb-a", "rb-b"]
    assert await _events(rebuilt, complete) == await _events(assembled, complete)
    # the usage ledger comes with the steps: the same lines, from the same chunks
    assert await _lines(rebuilt, complete) == await _lines(assembled, complete)
    assert (await _lines(rebuilt, ["rb-a"]))["rb-a"][0].usage == TokenUsage(3, 2)
    assert past == []
    by_session = {r.session: r for r in report}
    assert by_session["rb-a"].inserted == 2
    assert by_session["rb-b"].inserted == 2
    assert by_session["rb-live"].still_streaming == 1
    assert by_session["rb-live"].inserted == 0
    assert by_session["rb-old"].inserted == 1  # closed as the assembler would after its timeout
    assert sum(r.inserted for r in again) == 0  # idempotent
    old = (await _events(rebuilt, ["rb-old"]))["rb-old"]
    assert [type(e).__name__ for e in old] == ["ChunkEvent", "ErrorEvent"]
    assert old[-1].error.kind == "abandoned"  # type: ignore[attr-defined]  # the test's setup made this outcome an error event


async def test_sessions_past_retention_are_named(
    nc: Client, topology: Topology, tmp_path: Path
) -> None:
    await _publish(nc, topology)
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        report, past = await rebuild_store(
            nc, topology, store, ["rb-a", "gone-session"], AssemblyConfig()
        )
    finally:
        await store.close()
    assert [r.session for r in report] == ["rb-a"]
    assert past == ["gone-session"]


@pytest.mark.parametrize("argv", [["rebuild", "--session", "nope"]])
def test_rebuild_without_a_broker_url_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenwire.cli import main

    monkeypatch.delenv("TOKENWIRE_NATS_URL", raising=False)
    monkeypatch.setenv("TOKENWIRE_DATA_DIR", str(tmp_path))
    assert main(argv) == 2


async def test_the_store_is_listed_page_by_page(
    nc: Client, topology: Topology, tmp_path: Path
) -> None:
    """The sessions past retention are the store's minus the stream's: the store's are read
    in pages (one session a page here), so none is left out however many there are."""
    from tokenwire.cli._rebuild import _stored_sessions

    await _publish(nc, topology)
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        await rebuild_store(nc, topology, store, None, AssemblyConfig())
        listed = await _stored_sessions(store, page=1)
        at_once = {summary.session for summary in await store.sessions(limit=1000)}
    finally:
        await store.close()
    assert listed == at_once
    assert at_once >= {session for session, _, _ in STEPS}  # more than one page of one
