"""OpenAI Responses API *callers* (``POST /v1/responses``): validate, and translate the request
to the neutral one when the route speaks another dialect.

A Responses provider gets the body as sent (``model`` replaced, ``stream: true``). Any other
provider gets it through the neutral request, screened first by the translation table
(``_translation.py``): ``input`` items (messages with ``input_text`` / ``output_text`` /
``input_image`` parts, ``function_call`` and ``function_call_output`` items, ``reasoning``
items, whose summary becomes unsigned reasoning), ``instructions``, function tools,
``tool_choice``, ``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``,
``reasoning.effort``, ``text.format``, ``user``, ``safety_identifier``, ``metadata``.
"""

from __future__ import annotations

from typing import Any

import msgspec

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
    OutputFormat,
    ToolChoice,
)
from tokenwire.services.gateway._validate import convert


class ResponsesRequest(msgspec.Struct, frozen=True):
    """The fields of a Responses request the gateway reads (the rest is forwarded)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    @property
    def include_usage(self) -> bool:
        """Responses always reports usage in its final event."""
        return True

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last input item returns a tool result (same turn, next step)."""
        if isinstance(self.input, str) or not self.input:
            return False
        return self.input[-1].get("type") == "function_call_output"


def validate_responses(body: dict[str, Any]) -> ResponsesRequest:
    """Check the types of a decoded Responses body; a 400 names the first bad field."""
    return convert(body, ResponsesRequest)


def responses_to_neutral(req: ResponsesRequest) -> NeutralRequest:
    """Translate a validated request; items without a neutral meaning raise a 400."""
    messages: list[NeutralMessage] = []
    system = [req.instructions] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        role = item.get("role")
        if role in ("system", "developer"):
            system.append(_plain_text(item.get("content"), i))
            continue
        _add(messages, _item(item, i))
    reasoning = req.reasoning or {}
    return NeutralRequest(
        messages=messages,
        system="\n\n".join(system) or None,
        tools=[_tool(t, i) for i, t in enumerate(req.tools or [])],
        tool_choice=_tool_choice(req.tool_choice),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stream=req.stream,
        include_usage=True,
        output_format=_output_format(req.text),
        reasoning_effort=reasoning.get("effort"),
        parallel_tool_calls=req.parallel_tool_calls,
        user=req.user,
        safety_identifier=req.safety_identifier,
        metadata=req.metadata,
        store=req.store,
    )


def _add(messages: list[NeutralMessage], message: NeutralMessage) -> None:
    """Consecutive items of one role form one message (a turn's calls, a step's results)."""
    if messages and messages[-1].role == message.role and message.role != "user":
        last = messages[-1]
        messages[-1] = NeutralMessage(last.role, [*last.content, *message.content])
    else:
        messages.append(message)


def _item(item: dict[str, Any], i: int) -> NeutralMessage:
    kind = item.get("type", "message")
    match kind:
        case "message":
            role = item.get("role")
            if role not in ("user", "assistant"):
                raise InvalidRequestError(
                    f"input item role {role!r} is unknown", param=f"input[{i}]"
                )
            return NeutralMessage(role, _parts(item.get("content"), i))
        case "function_call":
            call = ToolCallBlock(
                str(item.get("call_id")), str(item.get("name")), str(item.get("arguments", ""))
            )
            return NeutralMessage("assistant", [call])
        case "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _plain_text(output, i)
            return NeutralMessage("tool", [ToolResultBlock(str(item.get("call_id")), text)])
        case "reasoning":
            summary = item.get("summary") or []
            text = "\n\n".join(s.get("text", "") for s in summary if isinstance(s, dict))
            return NeutralMessage("assistant", [ReasoningBlock(text)])
    raise InvalidRequestError(
        f"input item type {kind!r} cannot be translated to another dialect", param=f"input[{i}]"
    )


def _parts(content: Any, i: int) -> list[ContentBlock]:
    if isinstance(content, str):
        return [TextBlock(content)] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError("message content must be text or parts", param=f"input[{i}]")
    out: list[ContentBlock] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            out.append(TextBlock(part["text"]))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            out.append(_image(part["image_url"]))
        elif kind == "refusal":
            out.append(TextBlock(str(part.get("refusal", ""))))
        else:
            raise InvalidRequestError(
                f"content part {kind!r} cannot be translated", param=f"input[{i}].content"
            )
    return out


def _image(url: str) -> ImageBlock:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return ImageBlock(media_type=media_type, data=data)
    return ImageBlock(media_type="image/*", url=url)


def _plain_text(content: Any, i: int) -> str:
    blocks = _parts(content, i)
    if any(not isinstance(b, TextBlock) for b in blocks):
        raise InvalidRequestError("only text is allowed here", param=f"input[{i}]")
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _tool(tool: dict[str, Any], i: int) -> NeutralTool:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise InvalidRequestError(
            f"tool type {tool.get('type')!r} cannot be translated", param=f"tools[{i}]"
        )
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    return NeutralTool(tool["name"], tool.get("description"), params)


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    match choice:
        case None:
            return None
        case "auto" | "none" | "required":
            return ToolChoice(choice)
        case {"type": "function", "name": str(name)}:
            return ToolChoice("tool", name)
    raise InvalidRequestError("tool_choice cannot be translated", param="tool_choice")


def _output_format(text: dict[str, Any] | None) -> OutputFormat | None:
    fmt = (text or {}).get("format")
    match fmt:
        case None | {"type": "text"}:
            return None
        case {"type": "json_object"}:
            return OutputFormat("json_object")
        case {"type": "json_schema", "schema": dict(schema)}:
            return OutputFormat("json_schema", schema, fmt.get("name"), fmt.get("strict"))
    raise InvalidRequestError("text.format cannot be translated", param="text")
