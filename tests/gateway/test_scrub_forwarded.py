"""The same-dialect path forwards the provider's events as read: an in-stream error event that
echoes the gateway's provider key reaches the caller scrubbed, like the broker and the store."""

from __future__ import annotations

import json
from typing import Any

from tests.gateway._helpers import ANTHROPIC_KEY, GATEWAY_KEY, OPENAI_KEY, make_rig

USER = [{"role": "user", "content": "hi"}]

ANTHROPIC_ECHO = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":'
    b'"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,'
    b'"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
    b"event: error\ndata: "
    + json.dumps(
        {
            "type": "error",
            "error": {
                "type": "overloaded_error",
                "message": f"upstream rejected key {ANTHROPIC_KEY}",
            },
        }
    ).encode()
    + b"\n\n"
)

OPENAI_ECHO = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}'
    b"\n\ndata: "
    + json.dumps(
        {
            "error": {
                "message": f"Incorrect API key provided: {OPENAI_KEY}",
                "type": "invalid_request_error",
            }
        }
    ).encode()
    + b"\n\n"
)


async def _raw_stream(rig, path: str, body: dict[str, Any], **headers: str) -> bytes:
    async with rig.client(**headers) as client:
        response = await client.post(path, json=body)
        return bytes(response.content)


async def test_an_anthropic_error_event_echoing_the_key_is_scrubbed_for_the_caller() -> None:
    rig = make_rig(ANTHROPIC_ECHO)
    body = {"model": "anthropic/claude-x", "max_tokens": 10, "messages": USER, "stream": True}
    raw = await _raw_stream(rig, "/v1/messages", body, **{"x-api-key": GATEWAY_KEY})
    assert b"event: error" in raw  # the provider's event was forwarded ...
    assert ANTHROPIC_KEY.encode() not in raw  # ... without the key
    assert b"[redacted]" in raw
    assert all(ANTHROPIC_KEY.encode() not in m.raw for m in rig.sink.messages)


async def test_an_openai_error_chunk_echoing_the_key_is_scrubbed_for_the_caller() -> None:
    rig = make_rig(OPENAI_ECHO)
    body = {"model": "openai/gpt-4o", "messages": USER, "stream": True}
    raw = await _raw_stream(
        rig, "/v1/chat/completions", body, authorization=f"Bearer {GATEWAY_KEY}"
    )
    assert b"Incorrect API key provided" in raw
    assert OPENAI_KEY.encode() not in raw
    assert all(OPENAI_KEY.encode() not in m.raw for m in rig.sink.messages)
