"""The session viewer in headless Chromium, against a real server, broker and store.

The page is driven through its own buttons: the URL parameters ``steps=N`` and ``autoplay=1``
click Step N times and Play once after loading (see viewer.html); ``--dump-dom`` and
``--screenshot`` take the result after a virtual-time budget (timers fast-forward, network
fetches are waited for).
"""

from __future__ import annotations

import asyncio
import html
import os
import shutil
import uuid
from pathlib import Path

import msgspec
import pytest
from starlette.applications import Starlette

from tests.replay.http import serve
from tests.replay.sessions import (
    CALLS_0,
    EXPECTED_TEXT,
    REASONING_0,
    commit_folded,
    envelopes,
    publish,
)
from tests.store.ledger_fleet import CLAUDE, PRICED, expected_line, step
from tokenwire.ledger import StepUsage
from tokenwire.replay import events_router
from tokenwire.schemas import ChunkEnvelope, StepLink, TokenUsage
from tokenwire.store import open_store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
async def viewer(nc, topology, sqlite_url):
    """A served viewer over one recorded session; yields (base URL, session, envelopes)."""
    store = open_store(sqlite_url)
    session = f"w-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    await publish(nc, topology, sent)
    await commit_folded(store, sent)
    router = events_router(lambda: nc, topology, lambda: store)
    try:
        async with serve(Starlette(routes=router.routes)) as url:
            yield url, session, sent
    finally:
        await store.close()


async def run_chromium(binary: str, tmp_path: Path, *args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=20000",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


def sections(dom: str) -> tuple[str, str]:
    replay, _, messages = dom.partition("Assembled messages (store)")
    return replay, messages


@pytest.mark.slow
async def test_playing_a_session_shows_it_as_the_user_saw_it(chromium, viewer, tmp_path):
    url, session, sent = viewer
    page = f"{url}/viewer?session={session}&speed=max&autoplay=1"
    dom = (await run_chromium(chromium, tmp_path, "--dump-dom", page)).decode()

    replay, messages = sections(dom)
    assert f"event {len(sent)} / {len(sent)}" in replay
    assert "played to the end" in replay
    for text in EXPECTED_TEXT.values():
        assert text in replay
    assert REASONING_0 in replay
    for call in CALLS_0:
        assert f"⚙ tool call {call.name}({call.arguments})" in replay
    assert "search(" not in replay  # the truncated call was never shown
    assert "first chunk after 0.250 s" in replay
    assert "provider error: upstream overloaded" in replay
    # The store's assembled messages, beside it.
    assert EXPECTED_TEXT[1, 0] in messages
    assert "chunks 1-" in messages
    assert "provider error" in messages


@pytest.mark.slow
async def test_stepping_moves_the_cursor_one_event_at_a_time(chromium, viewer, tmp_path):
    url, session, sent = viewer
    page = f"{url}/viewer?session={session}&steps=5"
    dom = (await run_chromium(chromium, tmp_path, "--dump-dom", page)).decode()
    replay, _ = sections(dom)
    # Event 0 opens the reasoning block, events 1-4 each bring 4 characters of it.
    assert f"event 5 / {len(sent)}" in replay
    assert REASONING_0[:16] in replay
    assert REASONING_0[:17] not in replay

    shot = tmp_path / "viewer.png"
    await run_chromium(
        chromium,
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1280,900",
        f"{url}/viewer?session={session}&steps=60",
    )
    data = shot.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000


def usage_text(line: StepUsage) -> str:
    """What the viewer must print for a ledger line (written out here from the line)."""
    names = {
        "input_tokens": "in",
        "output_tokens": "out",
        "cache_read_tokens": "cache read",
        "cache_write_tokens": "cache write",
        "reasoning_tokens": "reasoning",
    }
    usage = line.usage
    counts = [f"{getattr(usage, k)} {v}" for k, v in names.items() if usage and getattr(usage, k)]
    tokens = f"tokens {' · '.join(counts)}" if counts else "no usage reported"
    if line.cost_pusd is not None:
        return f"{tokens} · cost ${line.cost_pusd / 10**12:.6f}"
    return f"{tokens} · cost — ({line.cost_reason})"


@pytest.mark.slow
async def test_the_store_column_shows_each_steps_tokens_and_cost(
    chromium, nc, topology, sqlite_url, tmp_path
):
    session = f"u-{uuid.uuid4().hex[:10]}"
    records = [
        step(session, 0, 0, PRICED),
        step(session, 0, 1, CLAUDE, provider="anthropic", model="claude-sonnet-4-5"),
        step(session, 1, 0, None),
        step(
            session,
            1,
            1,
            TokenUsage(input_tokens=10, output_tokens=8),
            provider="scripted",
            model="tools",
        ),
    ]
    await publish(nc, topology, [e for r in records for e in r.chunks])
    store = open_store(sqlite_url)
    try:
        await store.commit(records)
        router = events_router(lambda: nc, topology, lambda: store)
        async with serve(Starlette(routes=router.routes)) as url:
            page = f"{url}/viewer?session={session}"
            dom = (await run_chromium(chromium, tmp_path, "--dump-dom", page)).decode()
    finally:
        await store.close()
    _, messages = sections(html.unescape(dom))
    lines = [expected_line(r) for r in records]
    for line in lines:
        assert usage_text(line) in messages
    total = sum(line.cost_pusd or 0 for line in lines) / 10**12
    assert "session: tokens " in messages
    assert f"cost ${total:.6f} (2 steps unpriced)" in messages


def _with_parents(
    sent: list[ChunkEnvelope], parents: dict[tuple[int, int], StepLink]
) -> list[ChunkEnvelope]:
    """The envelopes with each listed step's parent on its first chunk (as the gateway puts
    it: docs/gateway.md, "Threading")."""
    return [
        msgspec.structs.replace(e, parent=parents[e.turn, e.step])
        if e.ordinal == 0 and (e.turn, e.step) in parents
        else e
        for e in sent
    ]


@pytest.mark.slow
async def test_a_purged_session_and_a_sub_agents_link_show_in_the_viewer(
    chromium, nc, topology, sqlite_url, tmp_path
):
    """The lead session's chunks are purged from the stream: the viewer shows it from the
    store, marked so, with its steps' parents; the sub-agent's session names the lead's step
    that spawned it, as a link to that session."""
    store = open_store(sqlite_url)
    lead, sub = f"w-{uuid.uuid4().hex[:10]}", f"w-{uuid.uuid4().hex[:10]}"
    spawner = StepLink(lead, 0, 0)
    lead_sent = _with_parents(envelopes(lead), {(1, 0): spawner, (1, 1): StepLink(lead, 1, 0)})
    sub_sent = _with_parents(envelopes(sub), {(0, 0): spawner})
    for sent in (lead_sent, sub_sent):
        await publish(nc, topology, sent)
        await commit_folded(store, sent)
    await nc.jetstream().purge_stream(topology.stream, subject=topology.session_filter(lead))
    router = events_router(lambda: nc, topology, lambda: store)
    try:
        async with serve(Starlette(routes=router.routes)) as url:
            lead_dom = await run_chromium(
                chromium,
                tmp_path,
                "--dump-dom",
                f"{url}/viewer?session={lead}&speed=max&autoplay=1",
            )
            sub_dom = await run_chromium(
                chromium, tmp_path, "--dump-dom", f"{url}/viewer?session={sub}&steps=1"
            )
    finally:
        await store.close()
    replay, messages = sections(html.unescape(lead_dom.decode()))
    for text in EXPECTED_TEXT.values():
        assert text in replay
    assert "from the store (gone from the broker)" in replay
    assert "after turn 0 step 0" in replay
    assert "after turn 1 step 0" in messages
    sub_replay, _ = sections(html.unescape(sub_dom.decode()))
    assert f' · spawned by <a href="?session={lead}">{lead} turn 0 step 0</a>' in sub_replay
    assert "from the store" not in sub_replay  # the sub-agent's session is on the broker
