"""What refusing repeated JSON names costs a request (issue 43), as a ratio to the same run's
baseline.

A model call's body is decoded once (msgspec) and encoded again with sorted keys (the
request's fingerprint, ``_resume/resume.py``); both happened before. The check added
(``_dialects/validate.py``, ``reject_duplicates``) counts ``:`` in the body and in that
encoding and searches the body for an escaped colon; only a body that fails the count is
parsed again with the standard library (the "exact" column: what the check would cost if it
parsed every body that way). Bodies: a one-message call, a 10-turn agent conversation with
tool calls (~5 KB), a 100-turn one (~230 KB).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from tokenwire.services.gateway._dialects.validate import _repeated_name, decode_object

FIGURES: dict[str, float] = {}
ROUNDS = 7


def conversation(turns: int, text_chars: int) -> bytes:
    """A Chat Completions body of ``turns`` user/tool-call/tool-result rounds."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful: answer."}]
    for i in range(turns):
        messages.append({"role": "user", "content": "word: " * (text_chars // 6)})
        arguments = json.dumps({"city": "x"})
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": '{"t": 21}'})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    body = {"model": "openai/gpt-4o", "messages": messages, "stream": True, "tools": tools}
    return json.dumps(body).encode()


def _before(body: bytes) -> None:
    """The path before the check: decoded, and encoded with sorted keys (the fingerprint)."""
    value = msgspec.json.decode(body)
    msgspec.json.encode(value, order="sorted")


def _after(body: bytes) -> None:
    decode_object(body)


def _exact(body: bytes) -> None:
    _before(body)
    _repeated_name(body)


def _us(fn: Callable[[bytes], None], body: bytes) -> float:
    """Microseconds per call, the fastest of :data:`ROUNDS` rounds (each ~0.2 s)."""
    n = max(1, int(200_000 / max(1, len(body)) * 50))
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(n):
            fn(body)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> str:
    rows = [
        "| body | bytes | before (us) | with the check (us) | ratio | exact parse (us) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, body in (
        ("one message", conversation(0, 0)),
        ("10 turns", conversation(10, 200)),
        ("100 turns", conversation(100, 2000)),
    ):
        before, after, exact = _us(_before, body), _us(_after, body), _us(_exact, body)
        FIGURES[f"{name} ratio"] = after / before
        rows.append(
            f"| {name} | {len(body)} | {before:.1f} | {after:.1f} | "
            f"{after / before:.2f} | {exact:.1f} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(main(), end="")
