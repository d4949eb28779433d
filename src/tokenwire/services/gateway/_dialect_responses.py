"""OpenAI Responses API requests, translated from the neutral request.

Only this direction: callers reach the ``openai-responses`` provider through the OpenAI Chat
or Anthropic endpoint and get the stream back in their dialect.

What changes on the way (docs/gateway.md, "Translation"):

- the conversation becomes ``input`` items: messages, ``function_call`` items for the
  assistant's tool calls and ``function_call_output`` items for their results (both keep the
  call id); the system prompt becomes ``instructions``;
- function tools are sent with ``strict: false``, the meaning they have in Chat Completions
  and Anthropic (Responses would otherwise make them strict);
- ``store: false`` unless the caller sent ``store``: the caller asked a stateless API, so
  nothing is kept at OpenAI on its behalf (tokenwire records the step itself);
- stop sequences have no Responses equivalent: a request with ``stop`` is refused (400)
  rather than answered without them; reasoning from the history is not sent (Responses needs
  its own encrypted reasoning items).
"""

from __future__ import annotations

from typing import Any, assert_never

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
)

Item = dict[str, Any]


def neutral_to_responses(req: NeutralRequest, model: str) -> dict[str, Any]:
    """A streaming Responses body for ``model``."""
    if req.stop:
        raise InvalidRequestError(
            "stop sequences cannot be translated to the OpenAI Responses API", param="stop"
        )
    body: dict[str, Any] = {
        "model": model,
        "input": [item for m in req.messages for item in _items(m)],
        "stream": True,
        "store": False,
    }
    if req.system:
        body["instructions"] = req.system
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        mode, name = req.tool_choice.mode, req.tool_choice.name
        body["tool_choice"] = {"type": "function", "name": name} if mode == "tool" else mode
    optional = {
        "max_output_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "metadata": req.metadata,
        "store": req.store,
        "service_tier": req.service_tier,
        "prompt_cache_key": req.prompt_cache_key,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if (effort := req.effort) is not None:
        body["reasoning"] = {"effort": effort}
    if (fmt := req.output_format) is not None:
        body["text"] = {"format": _format(fmt)}
    return body


def _format(fmt: OutputFormat) -> Item:
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    out: Item = {"type": "json_schema", "name": fmt.name or "output", "schema": fmt.schema}
    if fmt.strict is not None:
        out["strict"] = fmt.strict
    return out


def _items(m: NeutralMessage) -> list[Item]:
    """The message's items in order; its text and images form one message item."""
    out: list[Item] = []
    content: list[Item] = []
    for b in m.content:
        item, part = _render(b, m.role)
        if part is not None:
            content.append(part)
        if item is not None:
            out.append(item)
    if content:
        out.insert(
            0, {"role": "assistant" if m.role == "assistant" else "user", "content": content}
        )
    return out


def _render(b: ContentBlock, role: str) -> tuple[Item | None, Item | None]:
    """(a standalone item, a part of the message's content) for one block."""
    match b:
        case TextBlock(text=text):
            kind = "output_text" if role == "assistant" else "input_text"
            return None, ({"type": kind, "text": text} if text else None)
        case ImageBlock():
            return None, {"type": "input_image", "image_url": _image_url(b)}
        case ReasoningBlock():
            return None, None
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return {"type": "function_call", "call_id": id_, "name": name, "arguments": args}, None
        case ToolResultBlock(tool_call_id=tid, content=content):
            return {"type": "function_call_output", "call_id": tid, "output": content}, None
        case _:
            assert_never(b)


def _image_url(b: ImageBlock) -> str:
    return b.url if b.url is not None else f"data:{b.media_type};base64,{b.data}"


def _tool(t: NeutralTool) -> Item:
    tool: Item = {"type": "function", "name": t.name, "parameters": t.parameters, "strict": False}
    if t.description is not None:
        tool["description"] = t.description
    return tool
