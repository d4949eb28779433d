"""The fault tier's load and its checks.

Load: ``sessions`` concurrent sessions, each ``turns`` sequential streamed steps through the
gateway over real HTTP (OpenAI dialect, same-dialect path, the scripted ``text`` scenario,
paced so that steps are in flight when the fault lands). Ground truth: the scripted provider's
``expected_outcome`` for the body the gateway forwards (docs/scripted-provider.md).

Checks: every step the caller saw complete is stored and equal to the truth; no step is
stored as a message that differs from the truth; the chunk stream holds each step's chunks
once and in order; ``replay --verify`` (tokenwire.replay.verify) finds no difference.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
from nats.aio.client import Client

from tests.faults._services import GATEWAY_KEY
from tokenwire.broker import BrokerUnavailable, Topology
from tokenwire.replay import verify
from tokenwire.replay._source import stored_chunks
from tokenwire.schemas import ErrorEvent, MessageEvent, chunk_envelopes
from tokenwire.services.scripted_provider import ScriptedSettings, expected_outcome
from tokenwire.store import Store


def _size(name: str, default: float, least: float) -> float:
    """A fault-tier size from the environment (``make faults`` sets the full ones)."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a number") from None
    if value < least:
        raise ValueError(f"{name}={text!r}: expected at least {least}")
    return value


SESSIONS = int(_size("TOKENWIRE_FAULTS_SESSIONS", 30, 1))
"""Concurrent sessions of each case (CI: 30; ``make faults``: 100, the issue's manual run)."""
STORE_OUTAGE_S = _size("TOKENWIRE_FAULTS_STORE_OUTAGE_S", 0.0, 0.0)
"""How long the store faults keep the store down at least (0, CI: as long as the load's
remaining turns, ~5 s; ``make faults``: 10 s, with as many more turns as that needs)."""
SCRIPTED = ScriptedSettings(seed=15, length=24, fragment_size=3, token_rate=40.0, sentinel="FAULTS")
STEP_TIMEOUT_S = 90.0
MID_STREAM_EVENTS = 6
DRAIN_BOUND_S = 90.0


@dataclass
class StepResult:
    session: str
    turn: int
    messages: list[dict[str, str]]
    ok: bool
    error: str = ""
    latency_s: float = 0.0


@dataclass
class Load:
    """What the callers did and saw."""

    tag: str
    sessions: int
    turns: int = 2
    results: list[StepResult] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)  # every HTTP answer, for the scan
    first_turn_done: asyncio.Event = field(default_factory=asyncio.Event)
    mid_stream: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a caller of a later turn has read ``MID_STREAM_EVENTS`` events of its stream and
    not its end: a step is in flight, with chunks already published (a fault can be injected
    then, by condition, not by the clock)."""

    def session(self, i: int) -> str:
        return f"{self.tag}-{i:03d}"

    async def run(self, base_url: str, on_progress: Callable[[int], None] | None = None) -> None:
        done_first = 0

        async def one(i: int, client: httpx.AsyncClient) -> None:
            nonlocal done_first
            history: list[dict[str, str]] = []
            for turn in range(self.turns):
                history = [*history, {"role": "user", "content": f"question {turn} of {i}"}]
                result = await self._step(client, self.session(i), turn, history)
                self.results.append(result)
                if turn == 0:
                    done_first += 1
                    if done_first * 2 >= self.sessions:
                        self.first_turn_done.set()
                if not result.ok:
                    return  # the caller gives up on the session (as an agent would)
                history = [*history, {"role": "assistant", "content": result.error}]

        limits = httpx.Limits(max_connections=self.sessions + 8)
        async with httpx.AsyncClient(
            base_url=base_url, timeout=STEP_TIMEOUT_S, limits=limits
        ) as client:
            await asyncio.gather(*(one(i, client) for i in range(self.sessions)))
        self.first_turn_done.set()

    async def _step(
        self, client: httpx.AsyncClient, session: str, turn: int, messages: list[dict[str, str]]
    ) -> StepResult:
        body = {"model": "scripted/text", "messages": messages, "stream": True}
        headers = {"authorization": f"Bearer {GATEWAY_KEY}", "x-tokenwire-session": session}
        started = time.monotonic()
        try:
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                raw = await self._read(response, later_turn=len(messages) > 1)
        except httpx.HTTPError as exc:
            return StepResult(session, turn, messages, False, f"{type(exc).__name__}")
        self.answers.append(raw + str(response.headers).encode())
        ok = response.status_code == 200 and raw.rstrip().endswith(b"data: [DONE]")
        text = _text_of(raw) if ok else f"HTTP {response.status_code} {raw[-160:]!r}"
        return StepResult(session, turn, messages, ok, text, time.monotonic() - started)

    async def _read(self, response: httpx.Response, later_turn: bool) -> bytes:
        parts: list[bytes] = []
        events = 0
        async for part in response.aiter_bytes():
            parts.append(part)
            events += part.count(b"data: {")
            if later_turn and events >= MID_STREAM_EVENTS and b"[DONE]" not in part:
                self.mid_stream.set()
        return b"".join(parts)

    def counts(self) -> Counter[str]:
        return Counter("ok" if r.ok else "failed" for r in self.results)

    def latencies(self) -> list[float]:
        return sorted(r.latency_s for r in self.results if r.ok)


def _text_of(raw: bytes) -> str:
    import json

    text = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def expected_message(result: StepResult) -> Any:
    body = {
        "model": "text",
        "messages": result.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"X-Tokenwire-Session": result.session}
    return expected_outcome("text", body, SCRIPTED, headers=headers, dialect="openai").message


async def wait_drained(store: Store, load: Load, bound_s: float = DRAIN_BOUND_S) -> None:
    """Until every step the callers saw complete is in the store (bounded)."""
    deadline = time.monotonic() + bound_s
    wanted = Counter(r.session for r in load.results if r.ok)
    while True:
        stored = {s: len(await store.messages(s)) for s in wanted}
        if all(stored[s] >= n for s, n in wanted.items()):
            return
        missing = {s: (stored[s], n) for s, n in wanted.items() if stored[s] < n}
        assert time.monotonic() < deadline, f"not drained: {dict(list(missing.items())[:5])}"
        await asyncio.sleep(0.25)


async def caught_up(store: Store, load: Load, bound_s: float) -> tuple[float | None, int]:
    """(seconds until every step the callers saw complete is stored as a message, None past
    ``bound_s``; how many such steps were not stored then: 0 when caught up)."""
    started = time.monotonic()
    wanted = {(r.session, r.turn) for r in load.results if r.ok}
    while True:
        stored = {
            (s, o.turn)
            for s in {k[0] for k in wanted}
            for o in await store.messages(s)
            if isinstance(o, MessageEvent)
        }
        missing = len(wanted - stored)
        elapsed = time.monotonic() - started
        if not missing:
            return elapsed, 0
        if elapsed > bound_s:
            return None, missing
        await asyncio.sleep(0.25)


@dataclass
class Tally:
    """The promise, counted: what the callers completed, what the store and broker hold."""

    ok: int = 0
    failed: int = 0
    stored_messages: int = 0
    stored_errors: int = 0
    lost: int = 0
    wrong: int = 0
    chunks: int = 0
    duplicated: int = 0
    verified: int = 0
    differences: list[str] = field(default_factory=list)


async def check(store: Store, load: Load, operator: Client, topology: Topology) -> Tally:
    """Compare the store and the broker to the ground truth (see the module docstring)."""
    counts = load.counts()  # a Counter: 0 for a key it never saw, as Tally's defaults
    tally = Tally(ok=counts["ok"], failed=counts["failed"])
    by_key = {(r.session, r.turn): r for r in load.results}
    for i in range(load.sessions):
        session = load.session(i)
        outcomes = await store.messages(session)
        for outcome in outcomes:
            result = by_key.get((session, outcome.turn))
            if isinstance(outcome, MessageEvent):
                tally.stored_messages += 1
                if result is None or outcome.message != expected_message(result):
                    tally.wrong += 1
                    tally.differences.append(f"{session} turn {outcome.turn}: wrong message")
            elif isinstance(outcome, ErrorEvent):
                tally.stored_errors += 1
        stored_turns = {o.turn for o in outcomes if isinstance(o, MessageEvent)}
        for r in load.results:
            if r.session == session and r.ok and r.turn not in stored_turns:
                tally.lost += 1
                tally.differences.append(f"{session} turn {r.turn}: completed but not stored")
        await _check_chunks(operator, topology, session, tally)
        diffs = await _verify(operator, topology, store, session)
        tally.verified += not diffs
        tally.differences += [f"{session}: verify: {d}" for d in diffs]
    return tally


async def _check_chunks(operator: Client, topology: Topology, session: str, tally: Tally) -> None:
    ordinals: Counter[tuple[int, int, int]] = Counter()
    read = partial(stored_chunks, operator, topology, session, idle_timeout_s=20.0)
    async for batch in _retrying(read):
        for _, payload in batch:
            for env in chunk_envelopes(payload):
                ordinals[(env.turn, env.step, env.ordinal)] += 1
    tally.chunks += len(ordinals)
    tally.duplicated += sum(n - 1 for n in ordinals.values())
    steps = {(t, s) for t, s, _ in ordinals}
    for t, s in steps:
        got = sorted(o for (tt, ss, o) in ordinals if (tt, ss) == (t, s))
        if got != list(range(len(got))):
            tally.differences.append(f"{session} turn {t}: chunk ordinals not contiguous")


async def _retrying(make):
    """A replay, retried while a re-elected meta leader cannot create its consumer yet."""
    deadline = time.monotonic() + 30
    while True:
        try:
            items = [c async for c in make()]
            break
        except BrokerUnavailable:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
    for item in items:
        yield item


async def _verify(operator: Client, topology: Topology, store: Store, session: str) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        try:
            return [str(d) for d in await verify(operator, topology, store, session)]
        except BrokerUnavailable:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99), "max": values[-1]}
