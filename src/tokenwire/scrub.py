"""The one scrubbing point: what leaves a process (an error message, a log line, an HTTP
answer, a forwarded provider event) carries no credential.

- URLs lose their userinfo: ``nats://gateway:pw@h:4222`` -> ``nats://h:4222``;
- ``Authorization``/``x-api-key``/``x-goog-api-key`` values and ``Bearer`` tokens are redacted;
- strings shaped like provider keys (``sk-...``, ``sk-ant-...``, ``AIza...``) are redacted, and so
  are such keys masked with ``*`` (OpenAI's 401 echoes ``sk-abcde****...wxyz``: a part of it);
- every secret the process knows (its gateway keys, provider keys, the passwords of its own
  URLs; see :func:`register`) is redacted wherever it appears, and the caller may add more.

Redacted text reads ``[redacted]``. The patterns are deliberately broad: a false positive costs
a log line some characters, a miss leaks a key.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from collections.abc import Iterable

REDACTED = "[redacted]"
MIN_SECRET_LEN = 4

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]*@")
_HEADER = re.compile(
    r"(?P<name>\b(?:authorization|proxy-authorization|x-api-key|x-goog-api-key|api[-_]?key)"
    r"[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+|basic\s+)?[^\s\"',;}&]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<name>\bbearer\s+)[A-Za-z0-9._~+/=-]{4,}", re.IGNORECASE)
_KEY_SHAPES = re.compile(
    r"\b(?:(?:sk-|AIza)[A-Za-z0-9_-]*\*{3,}[A-Za-z0-9_-]*"  # masked: a part of a key
    r"|sk-[A-Za-z0-9_-]{8,}|AIza[0-9A-Za-z_-]{20,})"
)

_known: set[str] = set()
_lock = threading.Lock()


def register(*secrets: str) -> None:
    """Remember secrets of this process (too short ones are ignored: they would match noise)."""
    with _lock:
        _known.update(s for s in secrets if len(s) >= MIN_SECRET_LEN)


def register_urls(urls: Iterable[str]) -> None:
    """Remember the passwords (and percent-decoded forms) of ``urls``' userinfo."""
    for url in urls:
        parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
        if parts.password:
            register(parts.password, urllib.parse.unquote(parts.password))


def known() -> frozenset[str]:
    with _lock:
        return frozenset(_known)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without credentials (see the module docstring)."""
    text = _USERINFO.sub(r"\g<scheme>", text)
    text = _HEADER.sub(rf"\g<name>{REDACTED}", text)
    text = _BEARER.sub(rf"\g<name>{REDACTED}", text)
    text = _KEY_SHAPES.sub(REDACTED, text)
    for secret in sorted({*known(), *secrets}, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LEN and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub_bytes(data: bytes, secrets: Iterable[str]) -> bytes:
    """``data`` with the given secrets replaced (the hot path of forwarded provider events:
    only literal secrets, no patterns, so an event without one is returned as it is)."""
    for secret in secrets:
        raw = secret.encode()
        if raw in data:
            data = data.replace(raw, REDACTED.encode())
    return data


def scrub_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message and exception text scrubbed (formatted now, once)."""
    message = record.getMessage()
    cleaned = scrub(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = scrub(record.exc_text)
    return record


def install_log_scrubbing() -> None:
    """Scrub every log record of the process, whatever its logger or handler (uvicorn's
    included): the record factory does it as the record is made. Idempotent."""
    with _lock:
        make = logging.getLogRecordFactory()
        if getattr(make, "scrubs", False):
            return

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            return scrub_record(make(*args, **kwargs))

        factory.scrubs = True  # type: ignore[attr-defined]  # a marker attribute on the installed factory
        logging.setLogRecordFactory(factory)
