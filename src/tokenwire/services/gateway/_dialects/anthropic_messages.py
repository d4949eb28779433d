"""The Anthropic Messages dialect (``POST /v1/messages``), caller and provider.

In order: the request (validated, translated to and from the neutral request), the stream
encoder and the message and error bodies, then the :class:`AnthropicMessages` codec and its
forwarder.

Requests: validate, translate to and from the neutral request.

Content blocks stay dicts for validation (so block types the gateway does not know are still
forwarded to Anthropic) and are converted strictly only when the request is translated.

Answers: normalised chunks to the streamed events, the message, the error.

Anthropic numbers content blocks 0, 1, 2... in the order they open and needs a tool call's id
and name when its block opens, so the encoder maps each normalised ``index`` to the next
Anthropic index when the block first shows content (for a tool call: its first fragment, which
carries id and name). Blocks that are never closed by ``block-end`` (delta-only protocols) are
closed before ``message_delta``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, assert_never

import msgspec

from tokenwire.providers import SIGNATURE_MARK, Dialect
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    BlockType,
    ContentBlock,
    Finish,
    FinishReason,
    ImageBlock,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
)
from tokenwire.services.gateway._dialects.base import (
    CallerDialect,
    Reply,
)
from tokenwire.services.gateway._dialects.neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    ToolChoice,
    arguments_object,
    plain_call_id,
)
from tokenwire.services.gateway._dialects.validate import (
    OutputTokens,
    TopK,
    UnitInterval,
    convert,
)
from tokenwire.services.gateway._errors import GatewayError, InvalidRequestError
from tokenwire.sse import SseEvent


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
    strict: bool | None = None


class AnthropicRequest(msgspec.Struct, frozen=True):
    """The fields of a Messages request the gateway reads (the rest is forwarded)."""

    model: str
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    max_tokens: OutputTokens
    stream: bool = False
    system: str | list[dict[str, Any]] | None = None
    tools: list[_Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: UnitInterval | None = None
    top_p: UnitInterval | None = None
    stop_sequences: list[str] | None = None
    top_k: TopK | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last message is a user message made only of tool results."""
        last = self.messages[-1]
        if last.role != "user" or isinstance(last.content, str) or not last.content:
            return False
        return all(b.get("type") == "tool_result" for b in last.content)

    @property
    def opens_conversation(self) -> bool:
        """No assistant message (tool results follow one): the conversation's first call."""
        return all(m.role != "assistant" for m in self.messages)


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
        tools=[
            NeutralTool(t.name, t.description, t.input_schema or {}, t.strict is True)
            for t in req.tools or []
        ],
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
        if isinstance(out[-1], _Image) and not _carried(out[-1].source):
            raise InvalidRequestError(
                f"an image source of type {out[-1].source.type!r} cannot be translated (only "
                "base64 data and url are)",
                param=f"content[{i}].source",
            )
    return out


def _carried(source: _Source) -> bool:
    """Whether an image source holds the image itself (a file id means nothing elsewhere)."""
    return (source.type, source.data is None, source.url is None) in (
        ("base64", False, True),
        ("url", True, False),
    )


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
    elif req.tool_choice is not None and req.tool_choice.mode in ("required", "tool"):
        raise InvalidRequestError(  # Anthropic takes no tool_choice without tools
            "tool_choice forces a tool call but the request has no tools", param="tool_choice"
        )
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
    if t.strict:
        tool["strict"] = True
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


_STOP: dict[FinishReason, str] = {
    "stop": "end_turn",
    "tool-calls": "tool_use",
    "max-tokens": "max_tokens",
    "content-filter": "refusal",
    "refusal": "refusal",
    "error": "end_turn",
    "aborted": "end_turn",
}
_encode = msgspec.json.encode
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def anthropic_usage(usage: TokenUsage | None) -> dict[str, int]:
    """Disjoint counts in Anthropic's fields (its output count includes thinking); the cache
    counts only when the provider sent them (absent, never a made-up 0, as Anthropic's own
    stream leaves them out when it has none to report)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    out = {
        "input_tokens": usage.input_tokens or 0,
        "output_tokens": (usage.output_tokens or 0) + (usage.reasoning_tokens or 0),
    }
    if usage.cache_read_tokens is not None:
        out["cache_read_input_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens is not None:
        out["cache_creation_input_tokens"] = usage.cache_write_tokens
    return out


def anthropic_error_body(message: str, kind: str) -> bytes:
    """Anthropic's error object, the body of every error on ``/v1/messages``."""
    return _encode({"type": "error", "error": {"type": kind, "message": message}})


def anthropic_stream_error(message: str, kind: str) -> bytes:
    """The in-stream ``error`` event the Anthropic SDK raises on."""
    return b"event: error\ndata: " + anthropic_error_body(message, kind) + b"\n\n"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(data) + b"\n\n"


def _empty_block(kind: BlockType, delta: ToolCallDelta | None) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if kind == "tool-call" and delta is not None:
        return {"type": "tool_use", "id": delta.id, "name": delta.name or "", "input": {}}
    return {"type": "text", "text": ""}


class AnthropicStreamEncoder:
    """Encodes one step's chunks as Anthropic Messages server-sent events."""

    def __init__(self, *, message_id: str, model: str) -> None:
        self._id = message_id
        self._model = model
        self._slot: dict[int, int] = {}
        self._open: dict[int, BlockType] = {}
        self._usage: TokenUsage | None = None

    def start(self) -> bytes:
        """``message_start`` with an empty message (usage arrives with ``message_delta``)."""
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage(None),
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def encode(self, chunk: StreamChunk) -> bytes:
        """The SSE bytes for ``chunk`` (``b""`` when it has no Anthropic counterpart yet)."""
        match chunk:
            case BlockStart(index=index, block_type=kind):
                return b"" if kind == "tool-call" else self._opened(index, kind, None)
            case TextDelta(index=index, text=text):
                head = self._opened(index, "text", None)
                return head + self._delta(index, {"type": "text_delta", "text": text})
            case ReasoningDelta(index=index, text=text):
                head = self._opened(index, "reasoning", None)
                return head + self._delta(index, {"type": "thinking_delta", "thinking": text})
            case ToolCallDelta(index=index, arguments_delta=args):
                head = self._opened(index, "tool-call", chunk)
                delta = {"type": "input_json_delta", "partial_json": args}
                return head + (self._delta(index, delta) if args else b"")
            case BlockEnd(index=index, block=block):
                return self._block_end(index, block)
            case Usage(usage=usage):
                self._usage = usage
                return b""
            case Finish():
                return self._finish(chunk)
            case _:
                assert_never(chunk)

    def end(self) -> bytes:
        """The stream's terminator, ``message_stop``."""
        return MESSAGE_STOP

    def failure(self, message: str) -> bytes:
        """The in-stream ``error`` event."""
        return anthropic_stream_error(message, "api_error")

    def _opened(self, index: int, kind: BlockType, delta: ToolCallDelta | None) -> bytes:
        """``content_block_start`` the first time ``index`` shows up, else nothing."""
        if index in self._slot:
            return b""
        self._slot[index] = len(self._slot)
        self._open[index] = kind
        block = _empty_block(kind, delta)
        data = {"type": "content_block_start", "index": self._slot[index], "content_block": block}
        return _event("content_block_start", data)

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self._slot[index], "delta": delta}
        return _event("content_block_delta", data)

    def _stop(self, index: int) -> bytes:
        self._open.pop(index, None)
        data = {"type": "content_block_stop", "index": self._slot[index]}
        return _event("content_block_stop", data)

    def _block_end(self, index: int, block: ContentBlock) -> bytes:
        if index in self._slot:
            if index not in self._open:
                return b""  # already closed: a misbehaving adapter's duplicate end
            tail = b""
            if isinstance(block, ReasoningBlock) and block.signature:
                tail = self._delta(index, {"type": "signature_delta", "signature": block.signature})
            return tail + self._stop(index)
        return self._whole_block(index, block)

    def _whole_block(self, index: int, block: ContentBlock) -> bytes:
        match block:
            case TextBlock(text=text):
                out = self._opened(index, "text", None)
                out += self._delta(index, {"type": "text_delta", "text": text})
            case ReasoningBlock():
                out = self._whole_reasoning(index, block)
            case ToolCallBlock(id=id_, name=name, arguments=args):
                out = self.encode(ToolCallDelta(index, id_, name, args))
            case ToolResultBlock() | ImageBlock():
                return b""
            case _:
                assert_never(block)
        return out + self._block_end(index, block)

    def _whole_reasoning(self, index: int, block: ReasoningBlock) -> bytes:
        if block.redacted is None:
            out = self._opened(index, "reasoning", None)
            return out + self._delta(index, {"type": "thinking_delta", "thinking": block.text})
        self._slot[index] = len(self._slot)
        self._open[index] = "reasoning"
        content = {"type": "redacted_thinking", "data": block.redacted}
        data = {"type": "content_block_start", "index": self._slot[index], "content_block": content}
        return _event("content_block_start", data)

    def _finish(self, chunk: Finish) -> bytes:
        out = b"".join(self._stop(i) for i in list(self._open))
        if chunk.reason in ("error", "aborted"):
            message = chunk.error.message if chunk.error else "the step was aborted"
            return out + anthropic_stream_error(message, "api_error")
        delta = {"stop_reason": _STOP[chunk.reason], "stop_sequence": None}
        data = {"type": "message_delta", "delta": delta, "usage": anthropic_usage(self._usage)}
        return out + _event("message_delta", data)


def anthropic_message(message: Message, *, message_id: str, model: str) -> bytes:
    """The non-streaming ``message`` object for a folded message."""
    content = [c for c in (_content(b) for b in message.content) if c is not None]
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP[message.finish_reason],
        "stop_sequence": None,
        "usage": anthropic_usage(message.usage),
    }
    return _encode(body)


def _content(block: ContentBlock) -> dict[str, Any] | None:
    match block:
        case TextBlock(text=text):
            return {"type": "text", "text": text}
        case ReasoningBlock(text=text, signature=sig, redacted=None):
            return {"type": "thinking", "thinking": text, "signature": sig or ""}
        case ReasoningBlock(redacted=data):
            return {"type": "redacted_thinking", "data": data}
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return {"type": "tool_use", "id": id_, "name": name, "input": _input(args)}
        case ToolResultBlock() | ImageBlock():
            return None
        case _:
            assert_never(block)


def _input(arguments: str) -> Any:
    """The parsed arguments; a provider's invalid JSON is passed on as a string, not dropped."""
    try:
        return msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return arguments


# -- the caller dialect ----------------------------------------------------------------------


class AnthropicMessages:
    """``POST /v1/messages``."""

    dialect: CallerDialect = Dialect.ANTHROPIC_MESSAGES

    def parse(self, body: dict[str, Any]) -> AnthropicRequest:
        return validate_anthropic(body)

    def to_neutral(self, req: AnthropicRequest) -> NeutralRequest:
        return anthropic_to_neutral(req)

    def forwarded_body(self, body: dict[str, Any], model: str) -> bytes:
        if (messages := anthropic_plain_ids(body.get("messages"))) is not body.get("messages"):
            body = {**body, "messages": messages}  # Gemini thought signatures left out
        return _encode({**body, "model": model, "stream": True})

    def encoder(self, req: AnthropicRequest, reply: Reply) -> AnthropicStreamEncoder:
        return AnthropicStreamEncoder(message_id=reply.response_id, model=reply.model)

    def forwarder(self, req: AnthropicRequest) -> AnthropicForwarder:
        return AnthropicForwarder()

    def reply_id(self, raw_id: str) -> str:
        return f"msg_{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return anthropic_message(message, message_id=reply.response_id, model=reply.model)

    def error_body(self, exc: GatewayError) -> bytes:
        return anthropic_error_body(exc.message, _anthropic_type(exc.status))


def _anthropic_type(status: int) -> str:
    """Anthropic's error types by status (its documented table)."""
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
    }.get(status, "invalid_request_error" if status < 500 else "api_error")


class AnthropicForwarder:
    """The provider's Messages events as they are read, but ``message_stop`` (held for the
    acks) and nothing after it."""

    def __init__(self) -> None:
        self.error_sent = False
        self._ended = False

    def forwarded(self, event: SseEvent) -> bool:
        if self._ended:
            return False
        if event.event == "error":
            self.error_sent = True
        if event.event == "message_stop":
            self._ended = True
            return False
        return True

    def end(self) -> bytes:
        return MESSAGE_STOP

    def failure(self, message: str) -> bytes:
        return anthropic_stream_error(message, "api_error")
