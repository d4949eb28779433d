"""The neutral request: what the gateway translates between provider dialects.

Only what means the same in every dialect is here: messages made of the wire contract's content
blocks, a system prompt, tools with a JSON schema, and the common sampling settings. A request
using anything else is forwarded untouched to a provider of its own dialect, or refused with a
400 when it would have to be translated.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from tokenwire.providers import SIGNATURE_MARK, split_call_id
from tokenwire.schemas import ContentBlock, ToolCallBlock, ToolResultBlock
from tokenwire.services.gateway._errors import InvalidRequestError

Role = Literal["user", "assistant", "tool"]
"""``tool`` messages carry only tool results; Anthropic puts them in a user message."""


class NeutralMessage(msgspec.Struct, frozen=True):
    """One conversation message made of wire-contract content blocks."""

    role: Role
    content: list[ContentBlock]


class NeutralTool(msgspec.Struct, frozen=True):
    """A tool the model may call; ``parameters`` is its JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})


class ToolChoice(msgspec.Struct, frozen=True):
    """``auto``, ``none``, ``required`` (any tool), or ``tool`` with ``name``."""

    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None


class NeutralRequest(msgspec.Struct, frozen=True):
    """A chat request independent of dialect. ``include_usage`` is the caller's own wish."""

    messages: list[NeutralMessage]
    system: str | None = None
    tools: list[NeutralTool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last message returns tool results (a next step of the same turn)."""
        return bool(self.messages) and self.messages[-1].role == "tool"


def arguments_object(raw: str) -> dict[str, Any]:
    """A tool call's raw JSON arguments as the object dialects that nest them want; 400 if
    they are not a JSON object."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidRequestError("tool call arguments are not JSON", param="messages") from exc
    if not isinstance(value, dict):
        raise InvalidRequestError("tool call arguments must be a JSON object", param="messages")
    return value


def plain_call_id(call_id: str) -> str:
    """A tool call id without the Gemini thought signature it may carry: other providers cap
    ids (OpenAI at 40 characters) and have no use for the signature."""
    return split_call_id(call_id)[0] if SIGNATURE_MARK in call_id else call_id


def without_signatures(req: NeutralRequest) -> NeutralRequest:
    """The request with every tool call id and tool result reference plain (see above)."""
    if not any(_signed(b) for m in req.messages for b in m.content):
        return req
    messages = [
        msgspec.structs.replace(m, content=[_plain(b) for b in m.content]) for m in req.messages
    ]
    return msgspec.structs.replace(req, messages=messages)


def _signed(b: ContentBlock) -> bool:
    if isinstance(b, ToolCallBlock):
        return SIGNATURE_MARK in b.id
    return isinstance(b, ToolResultBlock) and SIGNATURE_MARK in b.tool_call_id


def _plain(b: ContentBlock) -> ContentBlock:
    if isinstance(b, ToolCallBlock):
        return msgspec.structs.replace(b, id=plain_call_id(b.id))
    if isinstance(b, ToolResultBlock):
        return msgspec.structs.replace(b, tool_call_id=plain_call_id(b.tool_call_id))
    return b
