"""Failure scenarios over a real socket: in-band errors, dropped and truncated streams, stalls,
HTTP errors before the stream, and the caller's own mistakes, in both dialects."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic.types import MessageParam, TextBlock
from openai.types.chat import ChatCompletionMessageParam

from tokenwire.services.scripted_provider import (
    ScriptedServer,
    ScriptedSettings,
    expected_outcome,
)
from tokenwire.services.scripted_provider._server import SHUTDOWN_GRACE_S

USER = [{"role": "user", "content": "hi"}]
# The same message, typed for each SDK's ``create``.
OA_USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
AN_USER: list[MessageParam] = [{"role": "user", "content": "hi"}]


def oa_body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": USER, "stream": True}


def an_body(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 256, "messages": USER, "stream": True}


async def openai_text_until_failure(
    client: openai.AsyncOpenAI, body: dict[str, Any], **kw: Any
) -> tuple[str, BaseException]:
    """The text the SDK delivered before the stream failed, and the failure."""
    seen: list[str] = []

    async def consume() -> None:
        async for chunk in await client.chat.completions.create(**body, **kw):
            seen.append((chunk.choices[0].delta.content or "") if chunk.choices else "")

    with pytest.raises(Exception) as info:  # noqa: PT011  # each test checks the type
        await consume()
    return "".join(seen), info.value


async def anthropic_text_until_failure(
    client: anthropic.AsyncAnthropic, body: dict[str, Any], **kw: Any
) -> tuple[str, BaseException]:
    seen: list[str] = []
    args = {k: v for k, v in body.items() if k != "stream"}

    async def consume() -> None:
        async with client.messages.stream(**args, **kw) as stream:
            async for event in stream:
                seen.append(event.text if event.type == "text" else "")

    with pytest.raises(Exception) as info:  # noqa: PT011  # each test checks the type
        await consume()
    return "".join(seen), info.value


def caused_by(exc: BaseException | None, name: str) -> bool:
    while exc is not None:
        if type(exc).__name__ == name:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def test_openai_midstream_error_chunk_raises_after_the_text(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    body = oa_body("scripted/error")
    text, exc = await openai_text_until_failure(openai_client, body)
    expected = expected_outcome("error", body, settings)
    assert isinstance(exc, openai.APIError)
    assert isinstance(exc.body, dict)
    assert expected.error is not None
    assert exc.body["code"] == expected.error.code == "server_error"
    assert exc.message == expected.error.message
    assert text == expected.text
    assert expected.failed
    assert expected.finish_reason == "error"
    assert expected.message is None


async def test_anthropic_midstream_error_event_is_overloaded(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    body = an_body("error")
    text, exc = await anthropic_text_until_failure(anthropic_client, body)
    expected = expected_outcome("error", body, settings, dialect="anthropic")
    assert isinstance(exc, anthropic.APIStatusError)
    assert isinstance(exc.body, dict)
    assert expected.error is not None
    assert exc.body["error"]["type"] == expected.error.code == "overloaded_error"
    assert text == expected.text


async def test_openai_drop_closes_the_connection_mid_stream(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings, caplog: pytest.LogCaptureFixture
) -> None:
    body = oa_body("drop")
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        text, exc = await openai_text_until_failure(openai_client, body)
    assert isinstance(exc, openai.APIConnectionError)
    assert caused_by(exc, "RemoteProtocolError")  # an incomplete chunked body, not a clean end
    expected = expected_outcome("drop", body, settings)
    assert text == expected.text
    assert expected.failed
    assert not [r for r in caplog.records if "without completing" in r.getMessage()]


async def test_anthropic_drop_closes_the_connection_mid_stream(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    body = an_body("drop")
    text, exc = await anthropic_text_until_failure(anthropic_client, body)
    assert caused_by(exc, "RemoteProtocolError")
    assert text == expected_outcome("drop", body, settings, dialect="anthropic").text


async def test_uvicorn_incomplete_response_errors_are_silenced_only_for_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tokenwire.services.scripted_provider._player import install_abort_filter

    install_abort_filter()
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        logging.getLogger("uvicorn.error").error(
            "ASGI callable returned without completing response."
        )
    assert len(caplog.records) == 1


async def test_openai_truncate_ends_cleanly_without_finish(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    body = oa_body("truncate")
    chunks = [c async for c in await openai_client.chat.completions.create(**body)]
    assert all(c.choices[0].finish_reason is None for c in chunks)
    expected = expected_outcome("truncate", body, settings)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert expected.failed


async def test_anthropic_truncate_has_no_stop_reason(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    body = an_body("truncate")
    async with anthropic_client.messages.stream(
        **{k: v for k, v in body.items() if k != "stream"}
    ) as s:
        final = await s.get_final_message()
    assert final.stop_reason is None
    block = final.content[0]
    assert isinstance(block, TextBlock)
    assert block.text == expected_outcome("truncate", body, settings, dialect="anthropic").text


async def test_stall_is_detected_by_a_short_client_timeout(
    server: ScriptedServer, settings: ScriptedSettings
) -> None:
    body = oa_body("stall")
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=httpx2.Timeout(0.5)
    )
    async with client:
        text, exc = await openai_text_until_failure(client, body)
    assert isinstance(exc, openai.APITimeoutError)
    expected = expected_outcome("stall", body, settings)
    assert expected.stall_after is not None
    assert expected.stall_after < expected.fragments.text
    assert len(text) == expected.stall_after * settings.fragment_size
    assert expected.text.startswith(text)


async def test_a_short_stall_resumes_and_completes(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    body = an_body("stall")
    headers = {"X-Scripted-Stall": "0.05"}
    args = {k: v for k, v in body.items() if k != "stream"}
    async with anthropic_client.messages.stream(**args, extra_headers=headers) as s:
        final = await s.get_final_message()
    expected = expected_outcome("stall", body, settings, headers=headers, dialect="anthropic")
    block = final.content[0]
    assert isinstance(block, TextBlock)
    assert block.text == expected.text
    assert final.stop_reason == "end_turn"


async def test_closing_the_server_ends_a_stalled_stream(settings: ScriptedSettings) -> None:
    async with ScriptedServer(settings) as server, httpx.AsyncClient(base_url=server.url) as http:
        request = http.build_request("POST", "/v1/chat/completions", json=oa_body("stall"))
        response = await http.send(request, stream=True)
        chunks = response.aiter_bytes()
        first = await anext(chunks)
        assert first.startswith(b"data: ")
        # Without the closing signal, uvicorn would hold the shutdown for its whole grace.
        await asyncio.wait_for(server.close(), timeout=SHUTDOWN_GRACE_S - 1)
        with pytest.raises(httpx.RemoteProtocolError):
            async for _ in chunks:
                pass


@pytest.mark.parametrize(
    ("scenario", "error_type", "status"),
    [("http-429", openai.RateLimitError, 429), ("http-500", openai.InternalServerError, 500)],
)
async def test_openai_http_errors_before_the_stream(
    openai_client: openai.AsyncOpenAI,
    settings: ScriptedSettings,
    scenario: str,
    error_type: type[openai.APIStatusError],
    status: int,
) -> None:
    body = oa_body(scenario)
    with pytest.raises(error_type) as info:
        await openai_client.chat.completions.create(**body)
    expected = expected_outcome(scenario, body, settings)
    assert info.value.status_code == expected.http_status == status
    assert expected.error is not None
    assert info.value.code == expected.error.code
    assert expected.error.retryable
    if status == 429:
        assert info.value.response.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("scenario", "error_type", "status"),
    [("http-429", anthropic.RateLimitError, 429), ("http-500", anthropic.InternalServerError, 500)],
)
async def test_anthropic_http_errors_before_the_stream(
    anthropic_client: anthropic.AsyncAnthropic,
    settings: ScriptedSettings,
    scenario: str,
    error_type: type[anthropic.APIStatusError],
    status: int,
) -> None:
    body = an_body(scenario)
    with pytest.raises(error_type) as info:
        await anthropic_client.messages.create(**body)
    expected = expected_outcome(scenario, body, settings, dialect="anthropic")
    assert info.value.status_code == expected.http_status == status
    assert isinstance(info.value.body, dict)
    assert expected.error is not None
    assert info.value.body["error"]["type"] == expected.error.code


async def test_non_streaming_error_is_an_overload_status(
    openai_client: openai.AsyncOpenAI, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(openai.InternalServerError) as oa:
        await openai_client.chat.completions.create(model="error", messages=OA_USER)
    with pytest.raises(anthropic.APIStatusError) as an:
        await anthropic_client.messages.create(model="error", max_tokens=9, messages=AN_USER)
    assert (oa.value.status_code, an.value.status_code) == (503, 529)


async def test_unknown_scenario_is_not_found_in_both_dialects(
    openai_client: openai.AsyncOpenAI, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(openai.NotFoundError):
        await openai_client.chat.completions.create(model="scripted/nope", messages=OA_USER)
    with pytest.raises(anthropic.NotFoundError) as info:
        await anthropic_client.messages.create(model="nope", max_tokens=9, messages=AN_USER)
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Scripted-Fragments": "many"},
        {"X-Scripted-Fragments": "0"},
        {"X-Scripted-Rate": "-1"},
        {"X-Scripted-Rate": "nan"},
        {"X-Scripted-Fragment-Size": "100000"},
    ],
)
async def test_invalid_overrides_are_bad_requests(
    openai_client: openai.AsyncOpenAI, headers: dict[str, str]
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await openai_client.chat.completions.create(
            model="text", messages=OA_USER, extra_headers=headers
        )
    assert info.value.code == "invalid_request_error"


async def test_unknown_model_option_is_a_bad_request(
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        await anthropic_client.messages.create(model="text?speed=9", max_tokens=9, messages=AN_USER)
    assert isinstance(info.value.body, dict)
    assert "speed" in info.value.body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/messages", b"[1, 2]"),
        ("/v1/messages", b'{"model": 3}'),
    ],
)
async def test_malformed_bodies_are_answered_400_in_the_dialect(
    server: ScriptedServer, path: str, content: bytes
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(path, content=content)
    assert response.status_code == 400
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"


async def test_healthz(server: ScriptedServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_non_streaming_drop_closes_the_connection(openai_client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIConnectionError) as info:
        await openai_client.chat.completions.create(model="drop", messages=OA_USER)
    assert caused_by(info.value, "RemoteProtocolError")
