"""Gemini ``streamGenerateContent`` requests, translated from the neutral request.

Only this direction: the gateway has no Gemini endpoint, so callers reach Gemini through the
OpenAI or Anthropic endpoint and the stream comes back in their dialect. Assistant messages
become ``model`` contents, tool results ``functionResponse`` parts named after their call,
tools ``functionDeclarations`` with ``parametersJsonSchema``; reasoning text from the history
is not sent, but thought signatures are: each comes back on its ``functionCall`` part from
the call's id, and a turn without one gets Google's documented skip value
(:data:`SKIP_SIGNATURE`). docs/gateway.md, "Dialects"; docs/providers.md, "Gemini".
"""

from __future__ import annotations

from typing import Any, assert_never

from tokenwire.providers import split_call_id
from tokenwire.schemas import (
    ContentBlock,
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.services.gateway._dialects.neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    ToolChoice,
    arguments_object,
)
from tokenwire.services.gateway._errors import InvalidRequestError

SKIP_SIGNATURE = "skip_thought_signature_validator"
"""The thought signature Google accepts in place of one a client could not keep."""


def neutral_to_gemini(req: NeutralRequest) -> dict[str, Any]:
    """A ``streamGenerateContent`` body (the model and streaming are in the URL)."""
    body: dict[str, Any] = {"contents": _contents(req.messages)}
    if req.system:
        body["systemInstruction"] = {"parts": [{"text": req.system}]}
    if req.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in req.tools]}]
    if req.tool_choice is not None:
        body["toolConfig"] = {"functionCallingConfig": _calling(req.tool_choice)}
    config: dict[str, Any] = {
        "maxOutputTokens": req.max_tokens,
        "temperature": req.temperature,
        "topP": req.top_p,
        "topK": req.top_k,
        "stopSequences": req.stop or None,
        "seed": req.seed,
        "frequencyPenalty": req.frequency_penalty,
        "presencePenalty": req.presence_penalty,
    }
    if req.output_format is not None:
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = req.output_format.schema
    if (budget := req.budget) is not None:
        config["thinkingConfig"] = {"thinkingBudget": budget, "includeThoughts": budget > 0}
    if any(v is not None for v in config.values()):
        body["generationConfig"] = {k: v for k, v in config.items() if v is not None}
    return body


def _contents(messages: list[NeutralMessage]) -> list[dict[str, Any]]:
    """One content per run of same-role messages (tool results are the user's)."""
    names = {b.id: b.name for m in messages for b in m.content if isinstance(b, ToolCallBlock)}
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "model" if m.role == "assistant" else "user"
        parts = [p for b in m.content if (p := _part(b, names)) is not None]
        if role == "model":
            _sign_first_call(parts)
        if not parts:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["parts"] += parts
        else:
            out.append({"role": role, "parts": parts})
    return out


def _part(b: ContentBlock, names: dict[str, str]) -> dict[str, Any] | None:
    match b:
        case TextBlock(text=text):
            return {"text": text} if text else None
        case ReasoningBlock():
            return None
        case ToolCallBlock(id=id_, name=name, arguments=args):
            part: dict[str, Any] = {"functionCall": {"name": name, "args": arguments_object(args)}}
            _, signature = split_call_id(id_)
            if signature is not None:
                part["thoughtSignature"] = signature
            return part
        case ToolResultBlock():
            return {"functionResponse": _response(b, names)}
        case ImageBlock():
            return _image(b)
        case _:
            assert_never(b)


def _sign_first_call(parts: list[dict[str, Any]]) -> None:
    """A model turn whose calls kept no signature: the skip value on its first call."""
    calls = [p for p in parts if "functionCall" in p]
    if calls and not any("thoughtSignature" in p for p in calls):
        calls[0]["thoughtSignature"] = SKIP_SIGNATURE


def _response(b: ToolResultBlock, names: dict[str, str]) -> dict[str, Any]:
    name = names.get(b.tool_call_id)
    if name is None:
        raise InvalidRequestError(
            f"tool result for {b.tool_call_id!r} answers no tool call in the conversation "
            "(Gemini needs the function's name)",
            param="messages",
        )
    return {"name": name, "response": {"error" if b.is_error else "result": b.content}}


def _image(b: ImageBlock) -> dict[str, Any]:
    if b.url is not None:
        return {"fileData": {"mimeType": b.media_type, "fileUri": b.url}}
    return {"inlineData": {"mimeType": b.media_type, "data": b.data}}


def _declaration(t: NeutralTool) -> dict[str, Any]:
    if t.strict:  # the translation table refuses it first (or drops it on opt-in)
        raise InvalidRequestError("Gemini has no strict function declarations", param="tools")
    declaration: dict[str, Any] = {"name": t.name, "parametersJsonSchema": t.parameters}
    if t.description is not None:
        declaration["description"] = t.description
    return declaration


def _calling(choice: ToolChoice) -> dict[str, Any]:
    match choice.mode:
        case "auto":
            return {"mode": "AUTO"}
        case "none":
            return {"mode": "NONE"}
        case "required":
            return {"mode": "ANY"}
        case "tool":
            return {"mode": "ANY", "allowedFunctionNames": [choice.name]}
        case _:
            assert_never(choice.mode)
