"""Caller headers forwarded to the provider: an allowlist per provider.

Only headers that change what the provider does for this request, and that mean the same
thing at the provider, are passed on; everything else the caller sends (its gateway key,
tokenwire's own headers, cookies...) stays at the gateway. The allowlist is the provider's
(``ProviderSpec.caller_headers``, carried by the route):

- ``anthropic``: ``anthropic-beta``;
- ``openai`` and ``openai-responses``: ``openai-beta``, ``openai-organization``,
  ``openai-project``;
- the scripted provider: all of the above (it stands in for both).

A value that cannot go on to the provider (a line break, a control character: no HTTP/1.1
parser hands one over, but an app hosted otherwise may get one) is the caller's 400, naming
the header, before anything is claimed or sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenwire.providers import check_header
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._routing.routing import Route


def forwarded_headers(caller: Mapping[str, str], route: Route) -> dict[str, str]:
    """The allowlisted headers the caller sent, as sent (lower-case names);
    :class:`InvalidRequestError` for one whose value cannot be sent on."""
    forwarded = {name: caller[name] for name in route.caller_headers if caller.get(name)}
    for name, value in forwarded.items():
        try:
            check_header(name, value)
        except ValueError:
            raise InvalidRequestError(
                f"the {name} header cannot be forwarded to the provider: a line break, a "
                "control character or a space at either end is not a header value",
                param=name,
            ) from None
    return forwarded


def merged(headers: Mapping[str, str], needs: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with what a translation needs added; ``anthropic-beta`` values are merged
    with what the caller sent (comma-separated)."""
    out = dict(headers)
    for name, value in needs.items():
        out[name] = merge_beta(out.get(name), value) if name == "anthropic-beta" else value
    return out


def merge_beta(sent: str | None, needed: str) -> str:
    """``anthropic-beta`` with ``needed`` added to what the caller sent (comma-separated)."""
    values = [v.strip() for v in (sent or "").split(",") if v.strip()]
    return ",".join(values if needed in values else [*values, needed])
