"""Wire-level properties the SDKs do not show: event framing, interleaving, event names.

The SSE bytes are split here by hand (blank-line separated ``event:``/``data:`` lines), an
independent reading of the format rather than the project's own parser.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings, expected_outcome

USER = [{"role": "user", "content": "hi"}]


def events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE event; asserts the framing is LF-only and well formed."""
    assert raw.endswith(b"\n\n")
    out = []
    for block in raw.decode("utf-8").split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) <= {"event", "data"}
        out.append((fields.get("event"), fields["data"]))
    return out


async def post(server: ScriptedServer, path: str, payload: dict[str, Any]) -> bytes:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(path, json=payload)
    assert response.status_code == 200
    return response.content


async def test_openai_tool_arguments_interleave_across_indexes(
    server: ScriptedServer, settings: ScriptedSettings
) -> None:
    payload = {"model": "scripted/tools", "messages": USER, "stream": True}
    data = [d for _, d in events(await post(server, "/v1/chat/completions", payload))]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    deltas = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    headers = [d["index"] for d in deltas if "id" in d]
    fragments = [d["index"] for d in deltas if "id" not in d]
    expected = expected_outcome("tools", payload, settings)
    assert headers == [0, 1]
    assert fragments[:4] == [0, 1, 0, 1]
    assert len(fragments) == expected.fragments.tool_arguments
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_openai_usage_chunk_has_no_choices_and_comes_last(server: ScriptedServer) -> None:
    payload = {
        "model": "text",
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    data = [d for _, d in events(await post(server, "/v1/chat/completions", payload))]
    assert data[-1] == "[DONE]"
    usage_chunk = json.loads(data[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] > 0
    assert all(json.loads(d)["usage"] is None for d in data[:-2])


async def test_anthropic_event_names_match_their_data_and_order(
    server: ScriptedServer, settings: ScriptedSettings
) -> None:
    payload = {"model": "reasoning", "max_tokens": 99, "messages": USER, "stream": True}
    evs = events(await post(server, "/v1/messages", payload))
    assert all(name == json.loads(data)["type"] for name, data in evs)
    names = [n for n, _ in evs]
    length = settings.length
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * (length + 1),  # thinking deltas, then the signature
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * length,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    signature = json.loads(evs[3 + length][1])["delta"]
    assert signature["type"] == "signature_delta"


async def test_anthropic_error_event_replaces_the_end_of_the_stream(server: ScriptedServer) -> None:
    payload = {"model": "error", "max_tokens": 99, "messages": USER, "stream": True}
    evs = events(await post(server, "/v1/messages", payload))
    assert evs[-1][0] == "error"
    assert json.loads(evs[-1][1])["error"]["type"] == "overloaded_error"
    assert "message_stop" not in [n for n, _ in evs]
