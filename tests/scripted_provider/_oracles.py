"""What the official SDKs accumulated, in tokenwire's terms, to compare with the expectation.

The name mappings here are written from the providers' documentation, independently of the
scripted provider's own tables.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tokenwire.schemas import TokenUsage, ToolCallBlock

OPENAI_FINISH = {"stop": "stop", "tool_calls": "tool-calls", "length": "max-tokens"}
ANTHROPIC_STOP = {"end_turn": "stop", "tool_use": "tool-calls", "max_tokens": "max-tokens"}


class Seen(msgspec.Struct, frozen=True):
    """One step as a client SDK saw it."""

    text: str
    reasoning: str
    tool_calls: list[ToolCallBlock]
    finish_reason: str | None
    usage: TokenUsage | None
    signature: str | None = None


def from_openai(completion: Any) -> Seen:
    """From an OpenAI ``ChatCompletion`` (or the stream helper's snapshot)."""
    choice = completion.choices[0]
    message = choice.message
    calls = [
        ToolCallBlock(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
    ]
    usage = None
    if completion.usage is not None:
        details = completion.usage.completion_tokens_details
        reasoning = details.reasoning_tokens if details else None
        usage = TokenUsage(
            input_tokens=completion.usage.prompt_tokens,
            output_tokens=completion.usage.completion_tokens - (reasoning or 0),
            reasoning_tokens=reasoning,
        )
    return Seen(
        text=message.content or "",
        reasoning=(message.model_extra or {}).get("reasoning_content") or "",
        tool_calls=calls,
        finish_reason=OPENAI_FINISH.get(choice.finish_reason or "", choice.finish_reason),
        usage=usage,
    )


def from_anthropic(message: Any, raw_inputs: dict[int, str] | None = None) -> Seen:
    """From an Anthropic ``Message``; ``raw_inputs`` are the streamed input JSON strings."""
    text, reasoning, signature, calls = "", "", None, []
    for index, block in enumerate(message.content):
        if block.type == "text":
            text += block.text
        elif block.type == "thinking":
            reasoning += block.thinking
            signature = block.signature
        elif block.type == "tool_use":
            raw = (raw_inputs or {}).get(index, json.dumps(block.input))
            calls.append(ToolCallBlock(block.id, block.name, raw))
    usage = TokenUsage(
        input_tokens=message.usage.input_tokens, output_tokens=message.usage.output_tokens
    )
    return Seen(
        text=text,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=ANTHROPIC_STOP.get(message.stop_reason or "", message.stop_reason),
        usage=usage,
        signature=signature,
    )
