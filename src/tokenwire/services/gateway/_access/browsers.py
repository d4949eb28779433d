"""Browsers: a keyless gateway answers only requests addressed to loopback, from no other site;
every model route takes only JSON.

Without keys the gateway is reachable by every web page this machine's browsers show, by two
paths: DNS rebinding (the page's own name resolves to 127.0.0.1: ``Host`` is not loopback)
and cross-site "simple" requests (``text/plain``, no preflight: ``Origin`` is another site).
So without keys (:func:`keyless_refusal`) a non-loopback ``Host`` (loopback: ``127.x``,
``localhost``, ``[::1]``, any port) is refused, and so is an ``Origin`` other than the
gateway's own. With keys neither applies (keys travel in headers a cross-site page cannot set
without a preflight). On every model route, keys or not, the body must be declared
``application/json`` (:func:`require_json`), the one type a page cannot send cross-site
without a preflight. The threat model: docs/gateway.md, "Browsers and a keyless gateway".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from tokenwire.services.gateway._errors import ForbiddenError, UnsupportedMediaTypeError

_LOOPBACK_NAMES = frozenset({"localhost", "[::1]"})
JSON_TYPE = "application/json"


def keyless_refusal(headers: Iterable[tuple[bytes, bytes]]) -> ForbiddenError | None:
    """Why a keyless gateway refuses a request with these raw headers, or None."""
    host = origin = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"host" and host is None:
            host = value.decode("latin-1")
        elif lowered == b"origin" and origin is None:
            origin = value.decode("latin-1")
    if host is None or not loopback_host(host):
        shown = "none" if host is None else repr(host[:100])
        return ForbiddenError(
            f"this gateway has no keys and answers only requests addressed to loopback "
            f"(Host 127.0.0.1, localhost or [::1]); Host was {shown}"
        )
    if origin is not None and origin.lower() != f"http://{host.lower()}":
        return ForbiddenError(
            f"this gateway has no keys and answers no other site's web page; Origin was "
            f"{origin[:100]!r} (configure gateway keys to call it from elsewhere)"
        )
    return None


def loopback_host(host: str) -> bool:
    """Whether a ``Host`` value names loopback: ``127.0.0.1`` (any ``127.x``), ``localhost``
    or ``[::1]``, with or without a port."""
    name, port = _split(host.strip().lower())
    if port and not port.isdigit():
        return False
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


def _split(host: str) -> tuple[str, str]:
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :]
        return host[: end + 1], rest[1:] if rest.startswith(":") else rest
    name, _, port = host.partition(":")
    return name, port


def require_json(headers: Mapping[str, str]) -> None:
    """UnsupportedMediaTypeError (415) unless the body is declared ``application/json``
    (parameters such as ``charset`` allowed)."""
    declared = headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != JSON_TYPE:
        shown = repr(declared[:100]) if declared else "none"
        raise UnsupportedMediaTypeError(
            f"the request body must be JSON, sent as Content-Type: {JSON_TYPE}; it was {shown}"
        )
