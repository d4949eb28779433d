"""Anthropic Messages requests: validate, translate to and from the neutral request.

Content blocks stay dicts for validation (so block types the gateway does not know are still
forwarded to Anthropic) and are converted strictly only when the request is translated.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec

from tokenwire.providers import SIGNATURE_MARK
from tokenwire.schemas import (
    ContentBlock,
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    ToolChoice,
    arguments_object,
    plain_call_id,
)
from tokenwire.services.gateway._validate import convert


class _Text(msgspec.Struct, tag="text", tag_field="type", frozen=True):
    text: str


class _Source(msgspec.Struct, frozen=True):
    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class _Image(msgspec.Struct, tag="image", tag_field="type", frozen=True):
    source: _Source


class _ToolUse(msgspec.Struct, tag="tool_use", tag_field="type", frozen=True):
    id: str
    name: str
    input: dict[str, Any]


class _ToolResult(msgspec.Struct, tag="tool_result", tag_field="type", frozen=True):
    tool_use_id: str
    content: str | list[_Text] = ""
    is_error: bool = False


class _Thinking(msgspec.Struct, tag="thinking", tag_field="type", frozen=True):
    thinking: str
    signature: str | None = None


class _Redacted(msgspec.Struct, tag="redacted_thinking", tag_field="type", frozen=True):
    data: str


_Block = _Text | _Image | _ToolUse | _ToolResult | _Thinking | _Redacted


class _Message(msgspec.Struct, frozen=True):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class _Tool(msgspec.Struct, frozen=True):
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None


class AnthropicRequest(msgspec.Struct, frozen=True):
    """The fields of a Messages request the gateway reads (the rest is forwarded)."""

    model: str
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stream: bool = False
    system: str | list[dict[str, Any]] | None = None
    tools: list[_Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop_sequences: list[str] | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last message is a user message made only of tool results."""
        last = self.messages[-1]
        if last.role != "user" or isinstance(last.content, str) or not last.content:
            return False
        return all(b.get("type") == "tool_result" for b in last.content)


def validate_anthropic(body: dict[str, Any]) -> AnthropicRequest:
    """Check the types of a decoded Messages body; a 400 names the first bad field."""
    return convert(body, AnthropicRequest)


def anthropic_to_neutral(req: AnthropicRequest) -> NeutralRequest:
    """Translate a validated request; blocks without a neutral meaning raise a 400."""
    messages: list[NeutralMessage] = []
    for m in req.messages:
        messages += _messages(m)
    return NeutralRequest(
        messages=messages,
        system=_system(req.system),
        tools=[NeutralTool(t.name, t.description, t.input_schema or {}) for t in req.tools or []],
        tool_choice=_tool_choice(req.tool_choice),
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=list(req.stop_sequences or []),
        stream=req.stream,
        include_usage=True,
        thinking_budget=_thinking_budget(req.thinking),
        parallel_tool_calls=_parallel(req.tool_choice),
        user=_user_id(req.metadata),
        top_k=req.top_k,
    )


def _thinking_budget(thinking: dict[str, Any] | None) -> int | None:
    match thinking:
        case None:
            return None
        case {"type": "disabled"}:
            return 0
        case {"type": "enabled", "budget_tokens": int(budget)} if budget > 0:
            return budget
    raise InvalidRequestError(
        "thinking must be enabled with budget_tokens, or disabled", param="thinking"
    )


def _parallel(choice: dict[str, Any] | None) -> bool | None:
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        return False
    return None


def _user_id(metadata: dict[str, Any] | None) -> str | None:
    user = (metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("metadata.user_id must be a string", param="metadata")
    return user


def _blocks(content: str | list[dict[str, Any]]) -> list[_Block]:
    if isinstance(content, str):
        return [_Text(content)]
    out: list[_Block] = []
    for i, raw in enumerate(content):
        try:
            out.append(msgspec.convert(raw, _Block))
        except msgspec.ValidationError as exc:
            what = raw.get("type")
            raise InvalidRequestError(
                f"content block {what!r} cannot be translated: {exc}", param=f"content[{i}]"
            ) from exc
    return out


def _messages(m: _Message) -> list[NeutralMessage]:
    blocks = [_neutral_block(b) for b in _blocks(m.content)]
    if m.role == "assistant":
        return [NeutralMessage("assistant", blocks)]
    results = [b for b in blocks if isinstance(b, ToolResultBlock)]
    rest: list[ContentBlock] = [b for b in blocks if not isinstance(b, ToolResultBlock)]
    out = [NeutralMessage("tool", list[ContentBlock](results))] if results else []
    return out + ([NeutralMessage("user", rest)] if rest else [])


def _neutral_block(b: _Block) -> ContentBlock:
    match b:
        case _Text(text=text):
            return TextBlock(text)
        case _Image(source=src):
            return ImageBlock(media_type=src.media_type or "image/*", data=src.data, url=src.url)
        case _ToolUse(id=id_, name=name, input=args):
            return ToolCallBlock(id_, name, json.dumps(args, separators=(",", ":")))
        case _ToolResult(tool_use_id=tid, content=content, is_error=err):
            text = content if isinstance(content, str) else "".join(t.text for t in content)
            return ToolResultBlock(tid, text, err)
        case _Thinking(thinking=text, signature=sig):
            return ReasoningBlock(text, signature=sig)
        case _Redacted(data=data):
            return ReasoningBlock("", redacted=data)


def _system(system: str | list[dict[str, Any]] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    texts = [b.get("text") for b in system]
    if not all(isinstance(t, str) for t in texts):
        raise InvalidRequestError("system blocks must be text", param="system")
    return "\n\n".join(str(t) for t in texts) or None


def _tool_choice(choice: dict[str, Any] | None) -> ToolChoice | None:
    match choice:
        case None:
            return None
        case {"type": "auto"}:
            return ToolChoice("auto")
        case {"type": "any"}:
            return ToolChoice("required")
        case {"type": "none"}:
            return ToolChoice("none")
        case {"type": "tool", "name": str(name)}:
            return ToolChoice("tool", name)
    raise InvalidRequestError("tool_choice is not one Anthropic defines", param="tool_choice")


STRUCTURED_OUTPUTS_BETA = "structured-outputs-2025-11-13"
"""The ``anthropic-beta`` value that enables ``output_format`` (structured outputs)."""


def neutral_to_anthropic(
    req: NeutralRequest, model: str, *, default_max_tokens: int
) -> dict[str, Any]:
    """A streaming Messages body for ``model`` (Anthropic requires ``max_tokens``)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": _render_messages(req.messages),
        "max_tokens": req.max_tokens or default_max_tokens,
        "stream": True,
    }
    if req.system:
        body["system"] = req.system
    if req.tools:
        body["tools"] = [_render_tool(t) for t in req.tools]
        _put_choice(body, req.tool_choice)
        if req.parallel_tool_calls is False:
            choice = body.setdefault("tool_choice", {"type": "auto"})
            choice["disable_parallel_tool_use"] = True
    extra = {"temperature": req.temperature, "top_p": req.top_p}
    body.update({k: v for k, v in extra.items() if v is not None})
    if req.stop:
        body["stop_sequences"] = req.stop
    if (user := req.safety_identifier or req.user) is not None:
        body["metadata"] = {"user_id": user}
    if req.output_format is not None:
        schema = req.output_format.schema or {"type": "object"}
        body["output_format"] = {"type": "json_schema", "schema": schema}
    _put_thinking(body, req)
    return body


def _put_thinking(body: dict[str, Any], req: NeutralRequest) -> None:
    """Thinking from an effort: the budget fits under the caller's max_tokens (OpenAI counts
    reasoning inside it too); without a caller limit the answer keeps the default on top."""
    budget = req.budget
    if not budget:
        return
    if req.max_tokens is None:
        body["max_tokens"] = budget + body["max_tokens"]
    budget = min(budget, body["max_tokens"] - 1)
    if budget < 1024:
        raise InvalidRequestError(
            f"reasoning needs a thinking budget of at least 1024 tokens below max_tokens "
            f"({body['max_tokens']}) toward Anthropic",
            param="reasoning_effort",
        )
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}


def _put_choice(body: dict[str, Any], choice: ToolChoice | None) -> None:
    match choice:
        case None:
            return
        case ToolChoice(mode="required"):
            body["tool_choice"] = {"type": "any"}
        case ToolChoice(mode="tool", name=name):
            body["tool_choice"] = {"type": "tool", "name": name}
        case ToolChoice(mode=mode):
            body["tool_choice"] = {"type": mode}


def _render_messages(messages: list[NeutralMessage]) -> list[dict[str, Any]]:
    """Tool results become user messages; consecutive same-role messages are merged."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "assistant" if m.role == "assistant" else "user"
        blocks = [_render_block(b) for b in m.content]
        blocks = [b for b in blocks if b is not None]
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return out


def _render_block(b: ContentBlock) -> dict[str, Any] | None:
    match b:
        case TextBlock(text=text):
            return {"type": "text", "text": text} if text else None
        case ReasoningBlock():
            return _render_reasoning(b)
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return {"type": "tool_use", "id": id_, "name": name, "input": arguments_object(args)}
        case ToolResultBlock(tool_call_id=tid, content=content, is_error=err):
            return {"type": "tool_result", "tool_use_id": tid, "content": content, "is_error": err}
        case ImageBlock():
            return {"type": "image", "source": _render_source(b)}


def _render_reasoning(b: ReasoningBlock) -> dict[str, Any] | None:
    """Only signed reasoning can go back to Anthropic; other providers' reasoning is dropped."""
    if b.redacted is not None:
        return {"type": "redacted_thinking", "data": b.redacted}
    if b.signature is None:
        return None
    return {"type": "thinking", "thinking": b.text, "signature": b.signature}


def _render_source(b: ImageBlock) -> dict[str, Any]:
    if b.url is not None:
        return {"type": "url", "url": b.url}
    return {"type": "base64", "media_type": b.media_type, "data": b.data}


def _render_tool(t: NeutralTool) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": t.name, "input_schema": t.parameters}
    if t.description is not None:
        tool["description"] = t.description
    return tool


def anthropic_plain_ids(messages: Any) -> Any:
    """Messages (as sent) with Gemini thought signatures taken out of ``tool_use`` ids and
    ``tool_result`` references (:func:`plain_call_id`); unchanged when none carries one."""
    if not isinstance(messages, list) or not any(_anthropic_signed(m) for m in messages):
        return messages
    return [_plain_anthropic_message(m) if isinstance(m, dict) else m for m in messages]


def _anthropic_signed(m: Any) -> bool:
    content = m.get("content") if isinstance(m, dict) else None
    if not isinstance(content, list):
        return False
    ids = [b.get("id") or b.get("tool_use_id") for b in content if isinstance(b, dict)]
    return any(isinstance(i, str) and SIGNATURE_MARK in i for i in ids)


def _plain_anthropic_message(m: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(m.get("content"), list):
        return m
    return {**m, "content": [_plain_block(b) for b in m["content"]]}


def _plain_block(b: Any) -> Any:
    if not isinstance(b, dict):
        return b
    if b.get("type") == "tool_use" and isinstance(b.get("id"), str):
        return {**b, "id": plain_call_id(b["id"])}
    if b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str):
        return {**b, "tool_use_id": plain_call_id(b["tool_use_id"])}
    return b
