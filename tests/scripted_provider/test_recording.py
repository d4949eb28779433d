"""The ``recording`` scenario replays a real provider recording's bytes verbatim."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fixtures.recordings import recordings_dir
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

USER = [{"role": "user", "content": "hi"}]


async def post_raw(
    server: ScriptedServer, path: str, model: str, headers: dict[str, str]
) -> httpx.Response:
    body = {"model": model, "messages": USER, "stream": True, "max_tokens": 9}
    async with httpx.AsyncClient(base_url=server.url) as http:
        return await http.post(path, json=body, headers=headers)


@pytest.mark.parametrize(
    ("endpoint", "name"),
    [
        ("/v1/chat/completions", "openai/chat-parallel-tool-calls-fragmented-usage.sse"),
        ("/v1/messages", "anthropic/messages-thinking-then-text.sse"),
        ("/v1/chat/completions", "google/gemini-stream-text.sse"),  # CRLF line endings
    ],
)
async def test_header_selected_recording_is_replayed_byte_for_byte(
    endpoint: str, name: str
) -> None:
    root = recordings_dir()
    settings = ScriptedSettings(recording_root=str(root))
    async with ScriptedServer(settings) as server:
        response = await post_raw(
            server, endpoint, "scripted/recording", {"X-Scripted-Recording": name}
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == (root / name).read_bytes()


async def test_server_option_recording_is_replayed_with_pacing() -> None:
    path = recordings_dir() / "groq" / "chat-midstream-error-tool-use-failed.sse"
    settings = ScriptedSettings(recording=str(path), token_rate=5000)
    async with ScriptedServer(settings) as server:
        response = await post_raw(server, "/v1/chat/completions", "recording", {})
    assert response.content == path.read_bytes()


@pytest.mark.parametrize(
    ("root", "header"),
    [
        (None, "openai/chat-text-include-usage.sse"),  # header not allowed without a root
        ("root", "../MANIFEST.md"),  # outside the root
        ("root", "openai/no-such-file.sse"),
    ],
)
async def test_unavailable_recordings_are_bad_requests(
    tmp_path: Path, root: str | None, header: str
) -> None:
    (tmp_path / "root" / "openai").mkdir(parents=True)
    (tmp_path / "MANIFEST.md").write_text("not servable")
    settings = ScriptedSettings(recording_root=str(tmp_path / root) if root else None)
    async with ScriptedServer(settings) as server:
        response = await post_raw(
            server, "/v1/messages", "recording", {"X-Scripted-Recording": header}
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert b"not servable" not in response.content


async def test_recording_without_any_file_is_a_bad_request() -> None:
    async with ScriptedServer(ScriptedSettings()) as server:
        response = await post_raw(server, "/v1/chat/completions", "recording", {})
    assert response.status_code == 400
