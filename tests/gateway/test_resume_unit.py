"""The resume path's edges on the in-memory twins (the real broker: test_resume.py)."""

from __future__ import annotations

import msgspec

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tests.gateway.test_errors_unit import AUTH, OPENAI_OK, assert_dialect_error
from tokenwire.services.gateway._dialects.validate import decode_object
from tokenwire.services.gateway._resume.resume import fingerprint

IDS = {"x-tokenwire-session": "unit-1", "x-tokenwire-turn": "0", "x-tokenwire-step": "0"}


def test_the_fingerprint_ignores_key_order_and_headers_but_not_the_path_or_body() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    same = dict(reversed(body.items()))

    def fp(path: str, value: dict[str, object]) -> str:  # as the gateway decodes a body
        return fingerprint(path, decode_object(msgspec.json.encode(value)).canonical)

    assert fp("/v1/chat/completions", body) == fp("/v1/chat/completions", same)
    assert fp("/v1/chat/completions", body) != fp("/v1/responses", body)
    assert fp("/v1/chat/completions", body) != fp("/v1/chat/completions", {**body, "stream": False})


async def test_a_step_no_longer_on_the_broker_is_410_not_a_new_call() -> None:
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    async with rig.client(**AUTH, **IDS) as client:
        assert (await client.post("/v1/chat/completions", json=OPENAI_OK)).status_code == 200
        rig.sink.messages.clear()  # the stream's retention passed
        triple = ("unit-1", 0, 0)
        old = msgspec.structs.replace(rig.steps.records[triple], time_ns=1)  # claimed long ago
        rig.steps.records[triple] = old
        again = await client.post("/v1/chat/completions", json=OPENAI_OK)
    error = assert_dialect_error("openai", again, 410)
    assert "no longer retained" in error["message"]
    assert again.headers["x-should-retry"] == "false"
    assert len(rig.upstream.requests) == 1


async def test_a_malformed_idempotency_key_is_400_before_anything_is_claimed() -> None:
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    headers = {"authorization": f"Bearer {GATEWAY_KEY}", "idempotency-key": "a b"}
    async with rig.client(**headers) as client:
        answer = await client.post("/v1/chat/completions", json=OPENAI_OK)
    error = assert_dialect_error("openai", answer, 400)
    assert error["param"] == "idempotency-key"
    assert not rig.steps.claimed
    assert not rig.upstream.requests
