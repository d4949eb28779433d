"""OpenAI Chat Completions requests: validate, translate to and from the neutral request.

Validation is lenient where forwarding needs it (content parts stay dicts, unknown fields are
kept in the forwarded body) and strict where translation needs it (a part that has no neutral
meaning is refused with a 400 naming it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from tokenwire.providers import SIGNATURE_MARK
from tokenwire.schemas import ContentBlock, ImageBlock, TextBlock, ToolCallBlock, ToolResultBlock
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    OutputFormat,
    ToolChoice,
    plain_call_id,
)
from tokenwire.services.gateway._validate import convert


class _Function(msgspec.Struct, frozen=True):
    name: str
    arguments: str = ""


class _ToolCall(msgspec.Struct, frozen=True):
    id: str
    function: _Function
    type: str = "function"


class _Message(msgspec.Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _ToolFunction(msgspec.Struct, frozen=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(msgspec.Struct, frozen=True):
    function: _ToolFunction
    type: str = "function"


class _StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


class OpenAIChatRequest(msgspec.Struct, frozen=True):
    """The fields of a Chat Completions request the gateway reads (the rest is forwarded)."""

    model: str
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    stream: bool = False
    stream_options: _StreamOptions | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None
    seed: int | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None

    @property
    def include_usage(self) -> bool:
        """Whether the caller asked for the final usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last message returns a tool result (same turn, next step)."""
        return self.messages[-1].role == "tool"


def validate_openai(body: dict[str, Any]) -> OpenAIChatRequest:
    """Check the types of a decoded Chat Completions body; a 400 names the first bad field."""
    return convert(body, OpenAIChatRequest)


def openai_to_neutral(req: OpenAIChatRequest) -> NeutralRequest:
    """Translate a validated request; parts without a neutral meaning raise a 400."""
    system = [_text_of(m.content) for m in req.messages if m.role in ("system", "developer")]
    return NeutralRequest(
        messages=[_message(m) for m in req.messages if m.role not in ("system", "developer")],
        system="\n\n".join(system) or None,
        tools=[_tool(t) for t in req.tools or []],
        tool_choice=_tool_choice(req.tool_choice),
        max_tokens=req.max_completion_tokens or req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        stream=req.stream,
        include_usage=req.include_usage,
        output_format=_output_format(req.response_format),
        reasoning_effort=req.reasoning_effort,
        parallel_tool_calls=req.parallel_tool_calls,
        user=req.user,
        safety_identifier=req.safety_identifier,
        metadata=req.metadata,
        store=req.store,
        seed=req.seed,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        service_tier=req.service_tier,
        prompt_cache_key=req.prompt_cache_key,
    )


def _output_format(value: dict[str, Any] | None) -> OutputFormat | None:
    match value:
        case None | {"type": "text"}:
            return None
        case {"type": "json_object"}:
            return OutputFormat("json_object")
        case {"type": "json_schema", "json_schema": {"schema": dict(schema)} as spec}:
            name, strict = spec.get("name"), spec.get("strict")
            return OutputFormat("json_schema", schema, name, strict)
    raise InvalidRequestError(
        "response_format must be text, json_object or json_schema with a schema",
        param="response_format",
    )


def _message(m: _Message) -> NeutralMessage:
    if m.role == "tool":
        content = _text_of(m.content)
        return NeutralMessage("tool", [ToolResultBlock(m.tool_call_id or "", content)])
    blocks = _parts(m.content)
    if m.role == "assistant":
        calls = m.tool_calls or []
        blocks += [ToolCallBlock(c.id, c.function.name, c.function.arguments) for c in calls]
        return NeutralMessage("assistant", blocks)
    return NeutralMessage("user", blocks)


def _parts(content: str | list[dict[str, Any]] | None) -> list[ContentBlock]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextBlock(content)] if content else []
    return [_part(p) for p in content]


def _part(part: dict[str, Any]) -> ContentBlock:
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return TextBlock(part["text"])
    if kind == "image_url" and isinstance(part.get("image_url"), dict):
        url = part["image_url"].get("url")
        if isinstance(url, str):
            return _image(url)
    raise InvalidRequestError(f"content part {kind!r} cannot be translated", param="messages")


def _image(url: str) -> ImageBlock:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return ImageBlock(media_type=media_type, data=data)
    return ImageBlock(media_type="image/*", url=url)


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    blocks = _parts(content)
    if any(not isinstance(b, TextBlock) for b in blocks):
        raise InvalidRequestError("only text is allowed here", param="messages")
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _tool(t: _Tool) -> NeutralTool:
    params = t.function.parameters or {"type": "object", "properties": {}}
    return NeutralTool(t.function.name, t.function.description, params)


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    match choice:
        case None:
            return None
        case "auto" | "none" | "required":
            return ToolChoice(choice)
        case {"type": "function", "function": {"name": str(name)}}:
            return ToolChoice("tool", name)
    raise InvalidRequestError("tool_choice is not one OpenAI defines", param="tool_choice")


def neutral_to_openai(
    req: NeutralRequest, model: str, *, legacy_max_tokens: bool
) -> dict[str, Any]:
    """A streaming Chat Completions body for ``model`` that always asks for usage.

    ``legacy_max_tokens`` sends ``max_tokens`` (OpenAI-compatible servers) instead of
    ``max_completion_tokens`` (OpenAI itself).
    """
    body: dict[str, Any] = {"model": model, "messages": _render_messages(req), "stream": True}
    body["stream_options"] = {"include_usage": True}
    if req.tools:
        body["tools"] = [_render_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _render_choice(req.tool_choice)
    if req.max_tokens is not None:
        body["max_tokens" if legacy_max_tokens else "max_completion_tokens"] = req.max_tokens
    _put_optional(body, temperature=req.temperature, top_p=req.top_p, stop=req.stop or None)
    _put_optional(body, reasoning_effort=req.effort, user=req.user or req.safety_identifier)
    if req.output_format is not None:
        body["response_format"] = _render_format(req.output_format)
    if req.parallel_tool_calls is False and req.tools:
        body["parallel_tool_calls"] = False
    return body


def _render_format(fmt: OutputFormat) -> dict[str, Any]:
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": fmt.name or "output", "schema": fmt.schema}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def _put_optional(body: dict[str, Any], **values: object) -> None:
    body.update({k: v for k, v in values.items() if v is not None})


def _render_messages(req: NeutralRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": req.system}] if req.system else []
    for m in req.messages:
        out += _render_message(m)
    return out


def _render_message(m: NeutralMessage) -> list[dict[str, Any]]:
    if m.role == "tool":
        return [_render_result(b) for b in m.content if isinstance(b, ToolResultBlock)]
    if m.role == "user":
        return [{"role": "user", "content": _render_parts(m.content)}]
    msg: dict[str, Any] = {"role": "assistant", "content": _joined_text(m.content) or None}
    calls = [b for b in m.content if isinstance(b, ToolCallBlock)]
    if calls:
        msg["tool_calls"] = [_render_call(c) for c in calls]
    return [msg]


def _render_result(b: ToolResultBlock) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": b.tool_call_id, "content": b.content}


def _render_call(c: ToolCallBlock) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _render_parts(blocks: list[ContentBlock]) -> str | list[dict[str, Any]]:
    if all(isinstance(b, TextBlock) for b in blocks):
        return _joined_text(blocks)
    return [_render_part(b) for b in blocks if isinstance(b, TextBlock | ImageBlock)]


def _render_part(b: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(b, TextBlock):
        return {"type": "text", "text": b.text}
    url = b.url if b.url is not None else f"data:{b.media_type};base64,{b.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _joined_text(blocks: list[ContentBlock]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _render_tool(t: NeutralTool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters}
    if t.description is not None:
        fn["description"] = t.description
    return {"type": "function", "function": fn}


def _render_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def openai_plain_ids(messages: Any) -> Any:
    """Chat messages (as sent) with Gemini thought signatures taken out of tool call ids and
    ``tool_call_id`` references (:func:`plain_call_id`); unchanged when none carries one."""
    if not isinstance(messages, list) or not any(_openai_signed(m) for m in messages):
        return messages
    return [_plain_openai_message(m) if isinstance(m, dict) else m for m in messages]


def _openai_signed(m: Any) -> bool:
    if not isinstance(m, dict):
        return False
    ids = [m.get("tool_call_id")]
    if isinstance(m.get("tool_calls"), list):
        ids += [c.get("id") for c in m["tool_calls"] if isinstance(c, dict)]
    return any(isinstance(i, str) and SIGNATURE_MARK in i for i in ids)


def _plain_openai_message(m: dict[str, Any]) -> dict[str, Any]:
    out = dict(m)
    if isinstance(m.get("tool_call_id"), str):
        out["tool_call_id"] = plain_call_id(m["tool_call_id"])
    if isinstance(m.get("tool_calls"), list):
        out["tool_calls"] = [
            {**c, "id": plain_call_id(c["id"])} if isinstance(c.get("id"), str) else c
            for c in m["tool_calls"]
            if isinstance(c, dict)
        ]
    return out
