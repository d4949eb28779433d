"""``GET /v1/models``: the routes file's public names, then the configured providers and the
models they list, in OpenAI's shape.

The public names (docs/gateway.md, "Routes") come first, ``owned_by: "tokenwire-routes"``,
as the routes in force name them (a reload shows at once).

A provider is configured when its credential or its base URL variable is set
(``TOKENWIRE_SCRIPTED_BASE_URL`` for the scripted provider). Each configured provider's own
model list is fetched (``GET {base}/models`` for OpenAI-compatible ones, ``/v1/models`` for
Anthropic, ``/v1beta/models`` for Gemini) and its models listed as ``provider/model``, the id a
caller sends as ``model``. Answers are cached per provider for ``ttl_s`` (a failure for
``failure_ttl_s``, so a provider that is down does not slow every listing); the cache holds at
most one entry per provider of the table. A provider whose list could not be read is reported
under the extra top-level ``providers`` field (``listed: false`` and why), never silently left
out; the OpenAI SDK ignores that field.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from tokenwire.providers import Dialect, ProviderConfigError, get_provider, provider_names
from tokenwire.services.gateway._routing.routes_file import SCRIPTED

log = logging.getLogger("tokenwire.gateway")
TTL_S = 300.0
FAILURE_TTL_S = 30.0
TIMEOUT_S = 5.0


def _list_path(dialect: Dialect) -> str:
    """Where a provider of ``dialect`` lists its models (below its base URL)."""
    match dialect:
        case Dialect.OPENAI_CHAT | Dialect.OPENAI_RESPONSES:
            return "/models"
        case Dialect.ANTHROPIC_MESSAGES:
            return "/v1/models"
        case Dialect.GEMINI:
            return "/v1beta/models"
        case _:
            assert_never(dialect)


@dataclass(frozen=True)
class _Source:
    provider: str
    url: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class _Listed:
    expires: float
    ids: tuple[str, ...]
    error: str | None


def configured_sources(env: Mapping[str, str]) -> list[_Source]:
    """Where each configured provider lists its models (scripted first, then table order)."""
    out: list[_Source] = []
    scripted = env.get("TOKENWIRE_SCRIPTED_BASE_URL", "").rstrip("/").removesuffix("/v1")
    if scripted:
        out.append(_Source(SCRIPTED, scripted + "/v1/models", {}))
    for name in provider_names():
        spec = get_provider(name)
        key = spec.api_key(env)
        if not key and not env.get(spec.base_url_env):
            continue
        try:
            base = spec.base_url(env)
        except ProviderConfigError:
            continue
        headers = dict(spec.auth_headers(key)) | dict(spec.headers)
        out.append(_Source(name, base + _list_path(spec.dialect), headers))
    return out


def _model_ids(body: Any) -> tuple[str, ...]:
    """``data[].id`` (OpenAI, Anthropic) or ``models[].name`` without ``models/`` (Gemini)."""
    if not isinstance(body, dict):
        raise ValueError("the model list is not a JSON object")
    if isinstance(body.get("data"), list):
        return tuple(str(m["id"]) for m in body["data"] if isinstance(m, dict) and "id" in m)
    if isinstance(body.get("models"), list):
        names = [str(m["name"]) for m in body["models"] if isinstance(m, dict) and "name" in m]
        return tuple(n.removeprefix("models/") for n in names)
    raise ValueError("the model list has neither data nor models")


class ModelCatalog:
    """The model list with its bounded per-provider cache. ``clock`` is monotonic seconds."""

    def __init__(
        self,
        env: Mapping[str, str],
        clock: Callable[[], float],
        *,
        ttl_s: float = TTL_S,
        failure_ttl_s: float = FAILURE_TTL_S,
        timeout_s: float = TIMEOUT_S,
        public: Callable[[], list[str]] = list,
    ) -> None:
        self._sources = configured_sources(env)
        self._public = public
        self._clock = clock
        self._ttl_s, self._failure_ttl_s, self._timeout_s = ttl_s, failure_ttl_s, timeout_s
        self._cache: dict[str, _Listed] = {}  # by provider: at most one per source
        self.fetches = 0

    async def listing(self) -> dict[str, Any]:
        """The OpenAI ``list`` object of every model, plus the ``providers`` report."""
        listed = await asyncio.gather(*(self._listed(s) for s in self._sources))
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "created": 0, "owned_by": "tokenwire-routes"}
            for name in self._public()
        ]
        providers: list[dict[str, Any]] = []
        for source, entry in zip(self._sources, listed, strict=True):
            data += [
                {
                    "id": f"{source.provider}/{i}",
                    "object": "model",
                    "created": 0,
                    "owned_by": source.provider,
                }
                for i in entry.ids
            ]
            report: dict[str, Any] = {"name": source.provider, "listed": entry.error is None}
            if entry.error is not None:
                report["error"] = entry.error
            providers.append(report)
        return {"object": "list", "data": data, "providers": providers}

    async def _listed(self, source: _Source) -> _Listed:
        now = self._clock()
        cached = self._cache.get(source.provider)
        if cached is not None and cached.expires > now:
            return cached
        entry = await self._fetch(source, now)
        self._cache[source.provider] = entry
        return entry

    async def _fetch(self, source: _Source, now: float) -> _Listed:
        import httpx  # here, on the first listing: the gateway's own upstream client is not httpx

        self.fetches += 1
        try:
            async with httpx.AsyncClient(timeout=self._timeout_s) as client:
                response = await client.get(source.url, headers=source.headers)
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            ids = _model_ids(response.json())
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            reason = f"listing the models failed: {type(exc).__name__}: {exc}"
            log.warning("provider %s: %s", source.provider, reason)
            return _Listed(now + self._failure_ttl_s, (), reason)
        return _Listed(now + self._ttl_s, ids, None)
