"""Caller headers forwarded to the provider: an allowlist per provider dialect.

Only headers that change what the provider does for this request, and that mean the same
thing at the provider, are passed on; everything else the caller sends (its gateway key,
tokenwire's own headers, cookies...) stays at the gateway.

- Anthropic-dialect routes: ``anthropic-beta``;
- providers ``openai`` and ``openai-responses``: ``openai-beta``, ``openai-organization``,
  ``openai-project``;
- the scripted provider: all of the above (it stands in for both).
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenwire.services.gateway._routing import SCRIPTED, Route

ANTHROPIC_HEADERS = ("anthropic-beta",)
OPENAI_HEADERS = ("openai-beta", "openai-organization", "openai-project")
_OPENAI_PROVIDERS = frozenset({"openai", "openai-responses"})


def allowed_headers(route: Route) -> tuple[str, ...]:
    """The caller headers (lower case) passed on to ``route``'s provider."""
    if route.provider == SCRIPTED:
        return ANTHROPIC_HEADERS + OPENAI_HEADERS
    if route.dialect == "anthropic-messages":
        return ANTHROPIC_HEADERS
    if route.provider in _OPENAI_PROVIDERS:
        return OPENAI_HEADERS
    return ()


def forwarded_headers(caller: Mapping[str, str], route: Route) -> dict[str, str]:
    """The allowlisted headers the caller sent, as sent (lower-case names)."""
    return {name: caller[name] for name in allowed_headers(route) if caller.get(name)}


def merge_beta(sent: str | None, needed: str) -> str:
    """``anthropic-beta`` with ``needed`` added to what the caller sent (comma-separated)."""
    values = [v.strip() for v in (sent or "").split(",") if v.strip()]
    return ",".join(values if needed in values else [*values, needed])
