"""The parts of a provider request the scripts read, decoded once at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import parse_qsl

import msgspec

from tokenwire.services.scripted_provider._errors import InvalidRequestBodyError

Dialect = Literal["openai", "anthropic"]
"""The wire format of an endpoint: OpenAI Chat Completions or Anthropic Messages."""

SESSION_HEADER = "x-tokenwire-session"
MODEL_PREFIX = "scripted/"


class _Function(msgspec.Struct, frozen=True):
    name: str | None = None


class _Tool(msgspec.Struct, frozen=True):
    name: str | None = None  # Anthropic
    function: _Function | None = None  # OpenAI

    @property
    def tool_name(self) -> str | None:
        return self.name or (self.function.name if self.function else None)


class _ContentPart(msgspec.Struct, frozen=True):
    type: str = ""


class _Message(msgspec.Struct, frozen=True):
    role: str = ""
    content: str | list[_ContentPart] | None = None

    @property
    def is_tool_result(self) -> bool:
        """OpenAI's ``role: tool`` or Anthropic's user message carrying a ``tool_result``."""
        if self.role == "tool":
            return True
        parts = self.content if isinstance(self.content, list) else []
        return self.role == "user" and any(p.type == "tool_result" for p in parts)


class _StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


class _Body(msgspec.Struct, frozen=True):
    model: str
    messages: list[_Message] = msgspec.field(default_factory=list)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    tools: list[_Tool] = msgspec.field(default_factory=list)


class StepRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a script depends on: the scenario, its options and a few facts of the request."""

    model: str
    scenario: str
    options: dict[str, str]
    stream: bool
    include_usage: bool
    message_count: int
    last_is_tool_result: bool
    tool_names: tuple[str, ...]
    session: str


def parse_model(model: str) -> tuple[str, dict[str, str]]:
    """``"scripted/text?fragments=3"`` -> ``("text", {"fragments": "3"})``; prefix optional."""
    name = model.removeprefix(MODEL_PREFIX)
    scenario, _, query = name.partition("?")
    return scenario, dict(parse_qsl(query, keep_blank_values=True))


def decode_request(
    body: bytes | str | Mapping[str, Any], headers: Mapping[str, str]
) -> StepRequest:
    """Decode a request body (raw JSON or already parsed) and its headers.

    Raises :class:`InvalidRequestBodyError` when the body is not the expected JSON object.
    """
    try:
        if isinstance(body, bytes | str):
            parsed = msgspec.json.decode(body, type=_Body)
        else:
            parsed = msgspec.convert(body, type=_Body)
    except msgspec.ValidationError as exc:
        raise InvalidRequestBodyError(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequestBodyError(f"not JSON: {exc}") from exc
    return _step_request(parsed, headers)


def _step_request(body: _Body, headers: Mapping[str, str]) -> StepRequest:
    scenario, options = parse_model(body.model)
    lowered = {k.lower(): v for k, v in headers.items()}
    return StepRequest(
        model=body.model,
        scenario=scenario,
        options=options,
        stream=body.stream,
        include_usage=body.stream_options is not None and body.stream_options.include_usage,
        message_count=len(body.messages),
        last_is_tool_result=bool(body.messages) and body.messages[-1].is_tool_result,
        tool_names=tuple(n for t in body.tools if (n := t.tool_name)),
        session=lowered.get(SESSION_HEADER, ""),
    )
