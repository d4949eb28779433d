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
    """A tool the model may call; ``parameters`` is its JSON schema, which the model's
    arguments must match exactly when ``strict``."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    strict: bool = False


class ToolChoice(msgspec.Struct, frozen=True):
    """``auto``, ``none``, ``required`` (any tool), or ``tool`` with ``name``."""

    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None


class OutputFormat(msgspec.Struct, frozen=True):
    """Structured output: any JSON object (``json_object``) or one matching ``schema``."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


EFFORT_BUDGETS: dict[str, int] = {
    "none": 0,
    "minimal": 0,
    "low": 1024,
    "medium": 8192,
    "high": 24576,
}
"""Thinking budgets for OpenAI's ``reasoning_effort`` (docs/providers.md, translation table)."""


def effort_for_budget(budget: int) -> str | None:
    """The ``reasoning_effort`` an Anthropic thinking budget comes closest to (0: none)."""
    if budget <= 0:
        return None
    if budget <= EFFORT_BUDGETS["low"]:
        return "low"
    return "medium" if budget <= EFFORT_BUDGETS["medium"] else "high"


class NeutralRequest(msgspec.Struct, frozen=True):
    """A chat request independent of dialect. ``include_usage`` is the caller's own wish.

    Reasoning is ``reasoning_effort`` (OpenAI callers) or ``thinking_budget`` (Anthropic
    callers; 0 = thinking disabled); each translator renders whichever its dialect needs.
    """

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
    output_format: OutputFormat | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    seed: int | None = None
    top_k: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None

    @property
    def effort(self) -> str | None:
        """The OpenAI reasoning effort asked for, directly or as a thinking budget."""
        if self.reasoning_effort is not None:
            return self.reasoning_effort
        return effort_for_budget(self.thinking_budget) if self.thinking_budget is not None else None

    @property
    def budget(self) -> int | None:
        """The thinking budget asked for, directly or as an effort (0: no thinking)."""
        if self.thinking_budget is not None:
            return self.thinking_budget
        if self.reasoning_effort is None:
            return None
        if self.reasoning_effort not in EFFORT_BUDGETS:
            raise InvalidRequestError(
                f"reasoning_effort {self.reasoning_effort!r} is not one OpenAI defines",
                param="reasoning_effort",
            )
        return EFFORT_BUDGETS[self.reasoning_effort]

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last message returns tool results (a next step of the same turn)."""
        return bool(self.messages) and self.messages[-1].role == "tool"

    @property
    def opens_conversation(self) -> bool:
        """No assistant or tool message: the conversation's first call."""
        return all(m.role not in ("assistant", "tool") for m in self.messages)


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
