"""Decoding a request body once, at the edge, into a typed request or a 400 naming the field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from tokenwire.services.gateway._errors import InvalidRequestError

T = TypeVar("T")
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")

# -- the ranges a request's numbers must fall in (docs/gateway.md, "Strict input") --------

MAX_OUTPUT_TOKENS = 2**24
"""The ceiling of every token limit (``max_tokens``, ``max_completion_tokens``,
``max_output_tokens``): 16,777,216, above the output of any model served today (the largest
context windows hold ~10M tokens) and far below the 32- and 64-bit integers a provider
parses them into, so that no limit the gateway forwards can overflow there (10^30 and 2^63
were forwarded as they came). Each model's own, lower limit stays the provider's to enforce."""
OutputTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)]
OpenAITemperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
"""OpenAI's (Chat Completions and Responses): 0 to 2."""
UnitInterval = Annotated[float, msgspec.Meta(ge=0, le=1)]
"""``top_p`` everywhere, and Anthropic's ``temperature``: 0 to 1."""
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
"""OpenAI's ``presence_penalty`` and ``frequency_penalty``: -2 to 2."""
TopK = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
"""Anthropic's ``top_k``: from 0, within a 32-bit integer."""
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""OpenAI's ``seed``: a 64-bit integer."""


@dataclass(frozen=True, slots=True)
class Body:
    """A request body decoded: ``value``, the JSON object, and ``canonical``, that object
    encoded again with its keys sorted (what a request's fingerprint hashes)."""

    value: dict[str, Any]
    canonical: bytes


def decode_object(body: bytes) -> Body:
    """The body as a JSON object; malformed JSON, another JSON type or a name repeated in one
    object (:func:`reject_duplicates`) is a 400."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequestError("request body is nested too deeply") from exc
    if not isinstance(value, dict):
        raise InvalidRequestError("request body must be a JSON object")
    canonical = msgspec.json.encode(value, order="sorted")
    reject_duplicates(body, canonical)
    return Body(value, canonical)


_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


def reject_duplicates(body: bytes, canonical: bytes) -> None:
    """InvalidRequestError naming the key when an object of ``body`` repeats a name.

    msgspec (like every fast decoder) keeps the last of a repeated name, so ``{"model": "a",
    "model": "b"}`` would be read as ``b`` while a proxy or log in front read ``a``. The check
    costs two byte counts: every name in the body is followed by one ``:`` and every other
    ``:`` is inside a string, which the decoded value keeps; so the body holds more ``:``
    than the value encoded again exactly when a member was dropped (or a string spelled a
    colon as ``\\u003a``). Only then is the body parsed again, slowly, to name the key."""
    if body.count(b":") == canonical.count(b":") and _ESCAPED_COLON.search(body) is None:
        return
    repeated = _repeated_name(body)
    if repeated is not None:
        raise InvalidRequestError(
            f"the name {repeated[:100]!r} appears twice in one object of the request body; "
            "a JSON object must not repeat a name (which one counts is not defined)",
            param=repeated[:100],
        )


class _Repeated(Exception):  # noqa: N818 - carries the name, never escapes this module
    def __init__(self, name: str) -> None:
        self.name = name


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _Repeated(name)
            seen.add(name)
    return value


def _repeated_name(body: bytes) -> str | None:
    """The first repeated name in ``body`` (a JSON object msgspec decoded), or None."""
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _Repeated as found:
        return found.name
    except RecursionError as exc:
        raise InvalidRequestError("request body is nested too deeply") from exc
    except ValueError:
        return None  # msgspec read it; what json cannot is no repeated name
    return None


def convert(value: dict[str, Any], into: type[T]) -> T:
    """``value`` converted to ``into``; a wrong type or value is a 400 whose param is its path."""
    try:
        return msgspec.convert(value, into)
    except RecursionError as exc:
        raise InvalidRequestError("request body is nested too deeply") from exc
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _PATH.search(text)
        param = found.group(1) if found else None
        raise InvalidRequestError(text, param=param or None) from exc
