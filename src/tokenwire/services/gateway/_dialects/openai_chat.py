"""The OpenAI Chat Completions dialect (``POST /v1/chat/completions``), caller and provider.

In order: the request (validated, translated to and from the neutral request), the stream
encoder and the completion and error bodies, then the :class:`OpenAIChat` codec and its
forwarder.

Requests: validate, translate to and from the neutral request.

Validation is lenient where forwarding needs it (content parts stay dicts, unknown fields are
kept in the forwarded body) and strict where translation needs it (a part that has no neutral
meaning is refused with a 400 naming it).

Answers: normalised chunks to the streamed chunks, the completion, the error.

The stream encoder is fed chunks in ordinal order and returns SSE bytes to send (often empty).
Delta-less protocols are covered: a block whose content arrives only in ``block-end`` is sent
as one delta then. Reasoning goes out as ``delta.reasoning_content`` (DeepSeek's convention,
which OpenAI-compatible clients read and the official SDK keeps as an extra field).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never

import msgspec

from tokenwire.providers import SIGNATURE_MARK, Dialect
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
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
    openai_error_type,
)
from tokenwire.services.gateway._dialects.neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    OutputFormat,
    ToolChoice,
    plain_call_id,
)
from tokenwire.services.gateway._dialects.validate import (
    OpenAITemperature,
    OutputTokens,
    Penalty,
    Seed,
    UnitInterval,
    convert,
)
from tokenwire.services.gateway._errors import GatewayError, InvalidRequestError
from tokenwire.sse import SseEvent


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
    strict: bool | None = None


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
    max_tokens: OutputTokens | None = None
    max_completion_tokens: OutputTokens | None = None
    temperature: OpenAITemperature | None = None
    top_p: UnitInterval | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None
    seed: Seed | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
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

    @property
    def opens_conversation(self) -> bool:
        """No assistant or tool message: the conversation's first call."""
        return all(m.role not in ("assistant", "tool") for m in self.messages)


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
    return NeutralTool(t.function.name, t.function.description, params, t.function.strict is True)


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
    if b.is_error:  # the translation table refuses it first (or drops it on opt-in)
        raise InvalidRequestError(
            "a tool result's error flag has no counterpart in Chat Completions",
            param="messages.content.is_error",
        )
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
    if t.strict:
        fn["strict"] = True
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


_FINISH: dict[FinishReason, str] = {
    "stop": "stop",
    "tool-calls": "tool_calls",
    "max-tokens": "length",
    "content-filter": "content_filter",
    "refusal": "stop",
    "error": "stop",
    "aborted": "stop",
}
_encode = msgspec.json.encode
DONE = b"data: [DONE]\n\n"


def openai_usage(usage: TokenUsage) -> dict[str, Any]:
    """Disjoint counts folded back into OpenAI's totals (cache inside prompt, reasoning inside
    completion)."""
    cached = (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
    prompt = (usage.input_tokens or 0) + cached
    completion = (usage.output_tokens or 0) + (usage.reasoning_tokens or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens or 0},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
    }


def openai_error_body(message: str, kind: str, *, param: str | None, code: str | None) -> bytes:
    """OpenAI's error object, the body of every error on ``/v1/chat/completions``."""
    return _encode({"error": {"message": message, "type": kind, "param": param, "code": code}})


def openai_stream_error(message: str, kind: str) -> bytes:
    """The in-stream error event the OpenAI SDK raises ``APIError`` on."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return b"data: " + _encode(body) + b"\n\n"


class OpenAIStreamEncoder:
    """Encodes one step's chunks as ``chat.completion.chunk`` server-sent events."""

    def __init__(
        self,
        *,
        completion_id: str,
        model: str,
        created: int,
        include_usage: bool,
        system_fingerprint: str | None = None,
    ) -> None:
        self._base: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        if system_fingerprint is not None:
            self._base["system_fingerprint"] = system_fingerprint
        self._include_usage = include_usage
        self._tool_slot: dict[int, int] = {}
        self._streamed: set[int] = set()
        self._usage: TokenUsage | None = None

    def start(self) -> bytes:
        """The opening chunk announcing the assistant role."""
        return self._delta({"role": "assistant", "content": ""})

    def encode(self, chunk: StreamChunk) -> bytes:
        """The SSE bytes for ``chunk`` (``b""`` when it has no OpenAI counterpart)."""
        match chunk:
            case BlockStart():
                return b""
            case Usage(usage=usage):
                self._usage = usage
                return b""
            case TextDelta(index=index, text=text):
                self._streamed.add(index)
                return self._delta({"content": text}) if text else b""
            case ReasoningDelta(index=index, text=text):
                self._streamed.add(index)
                return self._delta({"reasoning_content": text}) if text else b""
            case ToolCallDelta():
                self._streamed.add(chunk.index)
                return self._tool_delta(chunk)
            case BlockEnd(index=index, block=block):
                return b"" if index in self._streamed else self._whole_block(index, block)
            case Finish():
                return self._finish(chunk)
            case _:
                assert_never(chunk)

    def end(self) -> bytes:
        """The stream's terminator, ``data: [DONE]``."""
        return DONE

    def failure(self, message: str) -> bytes:
        """The in-stream error chunk."""
        return openai_stream_error(message, "api_error")

    def _tool_delta(self, chunk: ToolCallDelta) -> bytes:
        first = chunk.index not in self._tool_slot
        slot = self._tool_slot.setdefault(chunk.index, len(self._tool_slot))
        call: dict[str, Any] = {"index": slot, "function": {"arguments": chunk.arguments_delta}}
        if first:
            call.update(id=chunk.id, type="function")
            call["function"]["name"] = chunk.name or ""
        return self._delta({"tool_calls": [call]})

    def _whole_block(self, index: int, block: ContentBlock) -> bytes:
        match block:
            case TextBlock(text=text):
                return self._delta({"content": text})
            case ReasoningBlock(text=text):
                return self._delta({"reasoning_content": text}) if text else b""
            case ToolCallBlock(id=id_, name=name, arguments=args):
                return self._tool_delta(ToolCallDelta(index, id_, name, args))
            case ToolResultBlock() | ImageBlock():
                return b""
            case _:
                assert_never(block)

    def _finish(self, chunk: Finish) -> bytes:
        if chunk.reason in ("error", "aborted"):
            message = chunk.error.message if chunk.error else "the step was aborted"
            return openai_stream_error(message, "api_error")
        out = self._event(self._choice({}, _FINISH[chunk.reason]))
        if self._include_usage and self._usage is not None:
            out += self._event({"choices": [], "usage": openai_usage(self._usage)})
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event(self._choice(delta, None))

    @staticmethod
    def _choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"choices": [choice]}

    def _event(self, fields: dict[str, Any]) -> bytes:
        return b"data: " + _encode(self._base | fields) + b"\n\n"


def openai_completion(message: Message, *, completion_id: str, model: str, created: int) -> bytes:
    """The non-streaming ``chat.completion`` object for a folded message."""
    reply: dict[str, Any] = {"role": "assistant", "content": message.text or None, "refusal": None}
    reasoning = "".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
    if reasoning:
        reply["reasoning_content"] = reasoning
    if message.tool_calls:
        reply["tool_calls"] = [_call(c) for c in message.tool_calls]
    choice = {"index": 0, "message": reply, "logprobs": None}
    choice["finish_reason"] = _FINISH[message.finish_reason]
    body: dict[str, Any] = {"id": completion_id, "object": "chat.completion", "created": created}
    body.update(model=model, choices=[choice])
    if message.usage is not None:
        body["usage"] = openai_usage(message.usage)
    return _encode(body)


def _call(c: ToolCallBlock) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


# -- the caller dialect ----------------------------------------------------------------------


class OpenAIChat:
    """``POST /v1/chat/completions``."""

    dialect: CallerDialect = Dialect.OPENAI_CHAT

    def parse(self, body: dict[str, Any]) -> OpenAIChatRequest:
        return validate_openai(body)

    def to_neutral(self, req: OpenAIChatRequest) -> NeutralRequest:
        return openai_to_neutral(req)

    def forwarded_body(self, body: dict[str, Any], model: str) -> bytes:
        options = {**(body.get("stream_options") or {}), "include_usage": True}
        if (messages := openai_plain_ids(body.get("messages"))) is not body.get("messages"):
            body = {**body, "messages": messages}  # Gemini thought signatures left out
        return _encode({**body, "model": model, "stream": True, "stream_options": options})

    def encoder(self, req: OpenAIChatRequest, reply: Reply) -> OpenAIStreamEncoder:
        return OpenAIStreamEncoder(
            completion_id=reply.response_id,
            model=reply.model,
            created=reply.created,
            include_usage=req.include_usage,
            system_fingerprint=reply.system_fingerprint,
        )

    def forwarder(self, req: OpenAIChatRequest) -> OpenAIChatForwarder:
        return OpenAIChatForwarder(strip_usage=not req.include_usage)

    def reply_id(self, raw_id: str) -> str:
        return f"chatcmpl-{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return openai_completion(
            message, completion_id=reply.response_id, model=reply.model, created=reply.created
        )

    def error_body(self, exc: GatewayError) -> bytes:
        return openai_error_body(
            exc.message, openai_error_type(exc), param=exc.param, code=exc.code
        )


class _Probe(msgspec.Struct):
    choices: list[Any] | None = None
    usage: dict[str, Any] | None = None
    error: Any = None


_probe = msgspec.json.Decoder(_Probe)


class OpenAIChatForwarder:
    """The provider's Chat events as they are read, but ``[DONE]`` (held for the acks) and,
    for a caller that did not ask for usage, the usage-only chunk the gateway asked for."""

    def __init__(self, *, strip_usage: bool) -> None:
        self._strip_usage = strip_usage
        self.error_sent = False
        self._ended = False

    def forwarded(self, event: SseEvent) -> bool:
        data = event.data
        if self._ended:
            return False
        if data.startswith("[DONE]"):
            self._ended = True
            return False
        if '"error"' in data or (self._strip_usage and _may_be_usage_only(data)):
            try:
                probe = _probe.decode(data)
            except msgspec.DecodeError:
                return True
            if probe.error is not None:
                self.error_sent = True
            return not (self._strip_usage and probe.usage is not None and not probe.choices)
        return True

    def end(self) -> bytes:
        return DONE

    def failure(self, message: str) -> bytes:
        return openai_stream_error(message, "api_error")


def _may_be_usage_only(data: str) -> bool:
    """Whether an OpenAI event may be the usage-only chunk (so it must be decoded to tell).

    With ``include_usage`` OpenAI-compatible servers put ``"usage":null`` on every other
    chunk: those are recognised by that text, without decoding each event (a quote inside a
    JSON string is escaped, so the text can only be the structure).
    """
    return '"usage"' in data and '"usage":null' not in data
