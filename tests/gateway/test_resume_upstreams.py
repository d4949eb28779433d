"""A cut step resumes against the ``openai-responses`` and ``gemini`` upstreams (issue 28;
docs/gateway.md, "Resuming a step"), which the scripted provider does not speak.

A loopback HTTP server (``_recorded_upstream.py``, one per module) answers the gateway's
provider request with a real recorded stream of that dialect, byte for byte from the
recordings folder, reached through ``TOKENWIRE_<PROVIDER>_BASE_URL``. The rest is the rig of
test_resume.py: a reference gateway on its own topology gives the uninterrupted run's answer
as the official SDK assembles it; the gateway under test gets the same request cut at a point
the seeded RNG draws, then the SDK's retry, which must get that answer without a second
upstream call; the assembler then stores one message for the step.

Cut points: every cut kind (before the first byte, mid-text, mid-tool-call, after the
finish) for every caller dialect on each upstream, as for the scripted provider's dialects:
24 cases, each cut's position within its phase drawn by ``RESUME_SEED`` (printed).
Every combination holds but one, as documented: a Responses caller on a Responses upstream
gets the provider's own stream (forwarded), and its resumed stream is the gateway's
rendering of the stored chunks, which keeps the answer's content, names and usage but not
OpenAI's item ids nor the request settings OpenAI echoes in its response object.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from openai.types.responses import Response

from tests.fixtures.recordings import recordings_dir
from tests.gateway._recorded_upstream import RecordedUpstream, recorded_upstream
from tests.gateway._resume_rig import (
    CALLERS,
    CUTS,
    Case,
    Sent,
    cut_run,
    final_answer,
    fixed_clock,
    gateway,
    openai_client,
    reference_topology,
    scripted_server,
    stored_messages,
)
from tokenwire.broker import Topology
from tokenwire.schemas import MessageEvent

SEED = int(os.environ.get("RESUME_SEED", random.randrange(1 << 32)))
UPSTREAMS = ("openai-responses", "gemini")
RESPONSES = "openai-responses/responses-"
RECORDINGS = {
    ("openai-responses", "text"): f"{RESPONSES}text.sse",
    ("openai-responses", "tools"): f"{RESPONSES}parallel-function-calls.sse",
    ("openai-responses", "reasoning"): f"{RESPONSES}reasoning-then-function-call.sse",
    ("gemini", "text"): "google/gemini-stream-text.sse",
    ("gemini", "tools"): "google/gemini-stream-function-call-thought-signature.sse",
}
GEMINI_KEY = "gm-SENTINEL-resume-9c8b"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordedUpstream]:
    folder = recordings_dir()
    with recorded_upstream({key: folder / name for key, name in RECORDINGS.items()}) as server:
        yield server


def upstream_env(server: RecordedUpstream) -> dict[str, str]:
    return {
        "TOKENWIRE_OPENAI_RESPONSES_BASE_URL": server.url + "/v1",
        "TOKENWIRE_GEMINI_BASE_URL": server.url,
        "GEMINI_API_KEY": GEMINI_KEY,
    }


def phase_events(provider: str, scenario: str, cut: str) -> int:
    """How many events of the cut's phase the recording itself has (text deltas, tool-call
    argument deltas), read from its bytes: a caller's stream has at least as many."""
    body = (recordings_dir() / RECORDINGS[provider, scenario]).read_text()
    events = [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    if provider == "openai-responses":
        kind = "output_text" if cut == "mid-text" else "function_call_arguments"
        return sum(e["type"] == f"response.{kind}.delta" for e in events)
    key = "text" if cut == "mid-text" else "functionCall"
    parts = [p for e in events for c in e["candidates"] for p in c["content"]["parts"]]
    return sum(key in p and not p.get("thought") for p in parts)


def plan(provider: str, seed: int) -> list[Case]:
    """Every (caller, cut kind) pair for ``provider``, in sessions of their own, the cut's
    position within its phase drawn by the seeded RNG."""
    rng = random.Random(f"{seed}-{provider}")
    tag = rng.randrange(1 << 30)
    out = []
    for n, (caller, cut) in enumerate((c, k) for c in CALLERS for k in CUTS):
        case = Case(caller, provider, cut, f"up-{tag}-{n}-{caller}-{cut}", rng)
        if cut.startswith("mid-"):
            case.most = min(4, phase_events(provider, case.scenario, cut))
        out.append(case)
    return out


# -- what a re-rendered Responses answer keeps (docs/gateway.md, "Resuming a step") ---------

KEPT = {"id", "object", "created_at", "model", "status", "error", "incomplete_details", "usage"}
"""Response fields a forwarded Responses step's resumed answer keeps (its names and usage)."""
SHELL = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
"""The gateway's own values for the rest (the settings OpenAI echoes); all others None."""
PREFIX = {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}
NOT_RENDERED = {"encrypted_content", "status"}
"""Item fields the gateway does not render for a reasoning item."""


def rerendered_item(item: dict[str, Any], response_id: str, index: int) -> dict[str, Any]:
    """An output item as the gateway renders it: ids made from the response's id and the
    item's output index; a reasoning item without its encrypted content (and status)."""
    out = {**item, "id": f"{PREFIX[item['type']]}{response_id}_{index}"}
    if item["type"] == "reasoning":
        out |= dict.fromkeys(NOT_RENDERED)
    return out


def rerendered(response: dict[str, Any]) -> dict[str, Any]:
    """A forwarded Responses answer as its resumed rendering has it (see the module)."""
    declared = Response.model_fields  # the rest are OpenAI's extras (``store``): not rendered
    out = {k: response[k] if k in KEPT else SHELL.get(k) for k in response if k in declared}
    out["output"] = [
        rerendered_item(item, response["id"], i) for i, item in enumerate(response["output"])
    ]
    return out


def rerendered_event(event: dict[str, Any], response_id: str, kinds: dict[int, str]) -> Any:
    """One provider event as the gateway renders it again: the same type and number, item
    ids as above, no ``obfuscation`` (not stored), the response as :func:`rerendered`."""
    out = {**event}
    out.pop("obfuscation", None)  # an extra of OpenAI's deltas (not a declared SDK field)
    if "item_id" in out:
        out["item_id"] = f"{PREFIX[kinds[out['output_index']]]}{response_id}_{out['output_index']}"
    if "item" in out:
        out["item"] = rerendered_item(out["item"], response_id, out["output_index"])
    if "response" in out:
        out["response"] = rerendered(out["response"])
    return out


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", UPSTREAMS)
async def test_a_cut_step_on_a_recorded_upstream_resumes_without_a_second_call(
    provider: str,
    upstream: RecordedUpstream,
    nc: Client,
    topology: Topology,
    nats_url: str,
    tmp_path: Path,
) -> None:
    print(f"RESUME_SEED={SEED}")
    clock = fixed_clock()
    env = upstream_env(upstream)
    checked: list[Case] = []
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock, upstream_env=env) as reference,
        gateway(nc, topology, scripted.url, clock, upstream_env=env) as url,
    ):
        for case in plan(provider, SEED):
            sent = Sent()
            expected = await final_answer(reference, case, sent)
            before = upstream.calls(provider)
            await cut_run(url, case, sent.bodies[-1])
            assert upstream.calls(provider) == before + 1, case
            resumed = await final_answer(url, case, Sent())
            assert upstream.calls(provider) == before + 1, f"{case}: a second upstream call"
            if (case.caller, provider) == ("responses", "openai-responses"):
                expected = rerendered(expected)  # forwarded, then rendered again: documented
            assert resumed == expected, case
            checked.append(case)
        assert not scripted.received  # every call went to the recorded upstream
    assert upstream.refused == 0
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    for case in checked:
        rows = await stored_messages(nats_url, topology, store_url, case.session)
        assert [(type(r), r.turn, r.step) for r in rows] == [(MessageEvent, 0, 0)], case


@pytest.mark.parametrize("scenario", ["text", "reasoning"])
async def test_a_forwarded_responses_stream_resumes_with_starting_after(
    scenario: str, upstream: RecordedUpstream, nc: Client, topology: Topology
) -> None:
    """``retrieve(id, stream=True, starting_after=N)`` after a forwarded Responses stream
    (OpenAI's own events) was dropped at event N: the rest is the gateway's rendering of the
    stored chunks, with OpenAI's event types and ``sequence_number``s (the recordings'
    events all carry chunks; an encrypted reasoning item is rendered as OpenAI streams it),
    and with the documented differences (:func:`rerendered_event`); ``retrieve(id)`` is the
    rendered final response. One upstream call."""
    print(f"RESUME_SEED={SEED}")
    rng = random.Random(f"{SEED}-retrieve-{scenario}")
    model = f"openai-responses/{scenario}"
    session = {"x-tokenwire-session": f"retrieve-up-{rng.randrange(1 << 30)}-{scenario}"}
    async with (
        scripted_server() as scripted,
        gateway(
            nc, topology, scripted.url, fixed_clock(), upstream_env=upstream_env(upstream)
        ) as url,
        openai_client(url, Sent()) as client,
    ):
        before = upstream.calls("openai-responses")
        seen = [
            e.model_dump()
            async for e in await client.responses.create(
                model=model, input="resume me", stream=True, extra_headers=session
            )
        ]  # uninterrupted: what the provider sent, forwarded
        cut_at = rng.randrange(2, len(seen) - 2)
        response_id = seen[0]["response"]["id"]
        rest = [
            e.model_dump()
            async for e in await client.responses.retrieve(
                response_id, stream=True, starting_after=cut_at
            )
        ]
        final = await client.responses.retrieve(response_id)
    kinds = dict(_item_kinds(seen))
    assert [(e["type"], e["sequence_number"]) for e in seen[: cut_at + 1] + rest] == [
        (e["type"], e["sequence_number"]) for e in seen
    ], f"cut after sequence_number {cut_at}"
    assert rest == [rerendered_event(e, response_id, kinds) for e in seen[cut_at + 1 :]]
    assert final.model_dump() == rerendered(seen[-1]["response"])
    assert upstream.calls("openai-responses") == before + 1


def _item_kinds(events: list[dict[str, Any]]) -> Iterator[tuple[int, str]]:
    for event in events:
        if event["type"] == "response.output_item.added":
            yield event["output_index"], event["item"]["type"]
