"""Decoding a request body once, at the edge, into a typed request or a 400 naming the field."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from tokenwire.services.gateway._errors import InvalidRequestError

T = TypeVar("T")
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def decode_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; malformed JSON or another JSON type is a 400."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequestError("request body is nested too deeply") from exc
    if not isinstance(value, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return value


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
