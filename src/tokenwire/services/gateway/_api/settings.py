"""The gateway's settings: everything it reads from the environment, injected as one value.

Tests build :class:`GatewaySettings` directly and never touch the process environment;
``tokenwire gateway`` builds it with :meth:`GatewaySettings.from_env`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tokenwire import config
from tokenwire import variables as v
from tokenwire.broker import Topology, topology_from
from tokenwire.config import ConfigError, without_userinfo
from tokenwire.providers import check_header, check_proxy, check_url, get_provider, provider_names
from tokenwire.services.gateway._access.keys import (
    KeyRing,
    NamedKey,
    flat_keys,
    key_ring,
    load_keys_file,
    load_keys_records,
)
from tokenwire.services.gateway._access.live_keys import Bootstrap
from tokenwire.services.gateway._api.edge import EdgeLimits
from tokenwire.services.gateway._routing.plan import AttemptBounds
from tokenwire.services.gateway._routing.routes_file import RoutesConfig, load_routes
from tokenwire.services.gateway._steps.bounds import StepBounds
from tokenwire.services.gateway._steps.framing import FramePolicy
from tokenwire.variables import MAX_COALESCE_MS

DEFAULT_MAX_BODY_BYTES = v.GATEWAY_MAX_BODY_BYTES.value
_PROVIDER_VAR = re.compile(
    r"^(TOKENWIRE_[A-Z0-9_]+_BASE_URL|TOKENWIRE_[A-Z0-9_]+_DROP_PARAMS|[A-Z0-9_]+_API_KEY)$"
)
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
_SCRIPTED_BASE_URL = "TOKENWIRE_SCRIPTED_BASE_URL"
_NOT_A_HEADER = (
    "cannot be sent in the provider request's header: no line break, control character, "
    "character outside latin-1, or space at either end"
)


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway listens, whom it accepts, where providers are, and its bounds.

    - ``keys``: accepted gateway keys (``Authorization: Bearer`` or ``x-api-key``), the flat
      list: operators without a tenant (``_access/keys.py``); ``named_keys``: the named keys of the
      keys file (hashes, names, tenants, scopes). Both empty means no authentication, and
      then :func:`run` refuses any non-loopback ``host``. ``keys_file``: where the named keys
      came from, read again on ``SIGHUP`` (:meth:`reread_keys`).
    - ``provider_env``: the provider base URLs (``TOKENWIRE_<PROVIDER>_BASE_URL``),
      credentials (``OPENAI_API_KEY``, ...) and the translation drop opt-ins
      (``TOKENWIRE_GATEWAY_DROP_PARAMS``, ``TOKENWIRE_<PROVIDER>_DROP_PARAMS``) as
      environment-style variables.
    - ``max_body_bytes``: larger request bodies get a 413 without being read further.
    - ``continue_on_disconnect``: keep reading the provider to the end after the caller left,
      so the durable log is complete (else the step ends ``finish {aborted}``).
    - ``caller_buffer_bytes``: output held for a slow caller before the provider read waits
      (at most; see ``_output/caller.py``).
    - ``default_max_tokens``: sent to Anthropic when a translated request named none.
    - ``ack_timeout_s``: how long the end of a step waits for the broker's acks.
    - ``edge``: the HTTP edge's bounds (header size and count, header and body read
      timeouts, connections and requests at once; ``_api/edge.py``).
    - ``max_step_bytes``, ``max_step_chunks``, ``max_step_seconds``: the bounds of one step
      (content bytes, published chunks, seconds); past one the step ends as a recorded
      ``limit`` error, whether or not its caller is still there (docs/configuration.md).
    - ``partitions``, ``replicas``: the broker topology (session partitions, stream replicas);
      ``topology``: all of it (shards, retention, compression, placement), from the shared
      variables; None: the defaults with ``partitions`` and ``replicas``.
      ``provision``: create/update it at start (off when a provisioner owns it).
    - ``store_url``: the store the session and message routes read (``TOKENWIRE_STORE``).
    - ``framing``: chunks in frames (``TOKENWIRE_FRAMES``) and how long a frame may linger
      for more chunks (``TOKENWIRE_FRAME_LINGER_MS``; ``_steps/framing.py``, ADR 0024).
    - ``coalesce_ms``: the default wait between a step's provider reads past the first
      (``TOKENWIRE_GATEWAY_COALESCE_MS``; 0: none); a request's
      ``x-tokenwire-coalesce-ms`` overrides it (``_steps/coalesce.py``, ADR 0032).
    - ``step_retries``, ``step_retry_s``: the bound of the step registry's retries while its
      KV bucket elects a leader (count, total seconds of one assignment); past it 503.
    - ``max_resumers``: how many callers may resume one step at once on this gateway (a
      retry past it: 429 with ``retry-after``); ``idempotency_ttl_s``: how long an
      ``Idempotency-Key`` keeps mapping to its step (docs/gateway.md, "Resuming a step").
    - ``threading``: requests without a session header join the session whose answer they
      continue (``TOKENWIRE_GATEWAY_THREADING``; ``_access/threads.py``).
    - ``max_readers``: session event streams (``GET /v1/sessions/{s}/events``) open at once,
      each one bounded broker read; past it 503 with ``retry-after``.
    - ``metrics_key``: when set, ``GET /metrics`` answers only a request carrying it as a
      bearer token (``TOKENWIRE_GATEWAY_METRICS_KEY``); None: ``/metrics`` is open.
    - ``routes``: the routes file, checked (``TOKENWIRE_ROUTES_FILE``; None: only
      ``provider/model``), reloaded every ``routes_reload_s`` when it changed, its credentials
      read from ``routes_env``; ``attempts``: how far a routed step goes before its first byte
      (``TOKENWIRE_ROUTES_MAX_ATTEMPTS``, ``_MAX_WAIT_S``; docs/gateway.md, "Routes").
    - ``budget_default_max_tokens``: the output a call reserves under a budget when it set
      no ``max_tokens``; ``limits_hold_ttl_s``: how long a gateway's share of a key's
      streams or budget lasts unrenewed (docs/gateway.md, "Limits and budgets").

    Secrets (``keys``, ``provider_env``, ``metrics_key``, ``routes_env``) are left out of
    ``repr``.
    """

    host: str = v.GATEWAY_ADDR.value[0]
    port: int = v.GATEWAY_ADDR.value[1]
    nats_url: str | None = None
    keys: frozenset[str] = field(default=frozenset(), repr=False)
    named_keys: tuple[NamedKey, ...] = field(default=(), repr=False)
    provider_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    continue_on_disconnect: bool = v.GATEWAY_CONTINUE_ON_DISCONNECT.value
    caller_buffer_bytes: int = 1024 * 1024
    default_max_tokens: int = 4096
    ack_timeout_s: float = 35.0
    max_step_bytes: int = v.GATEWAY_MAX_STEP_BYTES.value
    max_step_chunks: int = v.GATEWAY_MAX_STEP_CHUNKS.value
    max_step_seconds: float = v.GATEWAY_MAX_STEP_SECONDS.value
    max_step_idle_seconds: float = v.GATEWAY_MAX_STEP_IDLE_SECONDS.value
    edge: EdgeLimits = field(default_factory=EdgeLimits)
    partitions: int = v.PARTITIONS.value
    replicas: int = v.REPLICAS.value
    provision: bool = v.PROVISION.value
    store_url: str | None = None
    step_retries: int = v.GATEWAY_STEP_RETRIES.value
    step_retry_s: float = v.GATEWAY_STEP_RETRY_S.value
    framing: FramePolicy = field(default_factory=FramePolicy)
    coalesce_ms: int = v.GATEWAY_COALESCE_MS.value
    max_resumers: int = v.GATEWAY_MAX_RESUMERS.value
    idempotency_ttl_s: float = v.GATEWAY_IDEMPOTENCY_TTL_S.value
    max_readers: int = v.GATEWAY_MAX_READERS.value
    threading: bool = v.GATEWAY_THREADING.value
    topology: Topology | None = None
    metrics_key: str | None = field(default=None, repr=False)
    keys_file: str | None = None
    routes: RoutesConfig | None = None
    routes_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    routes_reload_s: float = v.ROUTES_RELOAD_S.value
    attempts: AttemptBounds = field(default_factory=AttemptBounds)
    budget_default_max_tokens: int = v.BUDGET_DEFAULT_MAX_TOKENS.value
    limits_hold_ttl_s: float = v.LIMITS_HOLD_TTL_S.value

    def __post_init__(self) -> None:
        if not 0 <= self.coalesce_ms <= MAX_COALESCE_MS:
            why = f"must be 0 to {MAX_COALESCE_MS} ms"
            raise ConfigError(v.GATEWAY_COALESCE_MS.env, str(self.coalesce_ms), why)

    @property
    def authenticated(self) -> bool:
        """Whether any gateway key is configured (else no authentication, loopback only)."""
        return bool(self.keys or self.named_keys)

    def key_ring(self) -> KeyRing:
        """Every accepted key; :class:`ConfigError` when a key or a name is configured twice."""
        return key_ring(self.keys, self.named_keys)

    def reread_keys(self) -> KeyRing:
        """The keys as configured now: the keys file read again (``SIGHUP``), beside the flat
        list this process started with (its environment does not change); ConfigError as
        at start. A ring without keys is refused unless the gateway listens on loopback."""
        named = load_keys_file(self.keys_file) if self.keys_file else self.named_keys
        ring = key_ring(self.keys, named)
        if not ring and not self.loopback_only:
            why = "no keys left in it, and a gateway listening beyond loopback must have keys"
            raise ConfigError(v.GATEWAY_KEYS_FILE.env, self.keys_file or "", why)
        return ring

    def key_bootstrap(self) -> Bootstrap:
        """The keys this gateway has before the keys bucket: the flat list, the named keys, and
        the keys file's records (its tenants, and the seeds of the bucket)."""
        if self.keys_file is None:
            return Bootstrap(flat=flat_keys(self.keys), filed=self.named_keys)
        return self._file_bootstrap(self.named_keys)

    def reread_bootstrap(self) -> Bootstrap:
        """:meth:`key_bootstrap` with the keys file read again (``SIGHUP``); ConfigError as
        :meth:`reread_keys`."""
        self.reread_keys()
        if self.keys_file is None:
            return self.key_bootstrap()
        return self._file_bootstrap(load_keys_file(self.keys_file))

    def _file_bootstrap(self, named: tuple[NamedKey, ...]) -> Bootstrap:
        assert self.keys_file is not None
        records = load_keys_records(self.keys_file)
        return Bootstrap(
            flat=flat_keys(self.keys),
            filed=named,
            tenants={t.name: t.limits for t in records.tenants},
            seeds=(*records.tenants, *records.keys),
        )

    @property
    def broker_topology(self) -> Topology:
        """The topology to publish to, read from and (with ``provision``) provision."""
        if self.topology is not None:
            return self.topology
        return Topology(partitions=self.partitions, replicas=self.replicas)

    @property
    def loopback_only(self) -> bool:
        """Whether ``host`` is a loopback address."""
        return self.host in _LOOPBACK or self.host.startswith("127.")

    @property
    def step_bounds(self) -> StepBounds:
        """The bounds every step runs under."""
        return StepBounds(
            max_bytes=self.max_step_bytes,
            max_chunks=self.max_step_chunks,
            max_seconds=self.max_step_seconds,
            max_idle_seconds=self.max_step_idle_seconds,
        )

    def secrets(self) -> tuple[str, ...]:
        """Every credential value, to scrub from anything the gateway reports."""
        creds = [v for k, v in self.provider_env.items() if k.endswith("_API_KEY")]
        routed = self.routes.secrets() if self.routes is not None else ()
        own = (*self.keys, *creds, *([self.metrics_key] if self.metrics_key else []), *routed)
        return tuple(s for s in own if len(s) >= 4)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        """The shared settings (:func:`tokenwire.config.load`, read once), the gateway's own
        rows of :mod:`tokenwire.variables` and the provider variables.

        Raises :class:`tokenwire.config.ConfigError` on a malformed value.
        """
        env = os.environ if env is None else env
        provider_env = {k: value for k, value in env.items() if _PROVIDER_VAR.match(k)}
        check_provider_env(provider_env)
        check_proxy_env(env)
        shared = config.load(env)
        keys_file = v.GATEWAY_KEYS_FILE.read(env)
        routes_file = v.ROUTES_FILE.read(env)
        settings = cls(
            host=shared.gateway_host,
            port=shared.gateway_port,
            nats_url=shared.nats_url,
            keys=shared.gateway_keys,
            named_keys=load_keys_file(keys_file) if keys_file else (),
            keys_file=keys_file or None,
            provider_env=provider_env,
            max_body_bytes=v.GATEWAY_MAX_BODY_BYTES.read(env),
            continue_on_disconnect=v.GATEWAY_CONTINUE_ON_DISCONNECT.read(env),
            max_step_bytes=v.GATEWAY_MAX_STEP_BYTES.read(env),
            max_step_chunks=v.GATEWAY_MAX_STEP_CHUNKS.read(env),
            max_step_seconds=v.GATEWAY_MAX_STEP_SECONDS.read(env),
            max_step_idle_seconds=v.GATEWAY_MAX_STEP_IDLE_SECONDS.read(env),
            edge=_edge(env),
            partitions=shared.partitions,
            replicas=shared.replicas,
            provision=shared.provision,
            store_url=shared.store_url,
            step_retries=v.GATEWAY_STEP_RETRIES.read(env),
            step_retry_s=v.GATEWAY_STEP_RETRY_S.read(env),
            framing=framing_from_env(env),
            coalesce_ms=v.GATEWAY_COALESCE_MS.read(env),
            max_resumers=v.GATEWAY_MAX_RESUMERS.read(env),
            idempotency_ttl_s=v.GATEWAY_IDEMPOTENCY_TTL_S.read(env),
            max_readers=v.GATEWAY_MAX_READERS.read(env),
            threading=v.GATEWAY_THREADING.read(env),
            topology=topology_from(shared),
            metrics_key=v.GATEWAY_METRICS_KEY.read(env) or None,
            routes=load_routes(routes_file, env) if routes_file else None,
            routes_env=env,
            routes_reload_s=v.ROUTES_RELOAD_S.read(env),
            attempts=AttemptBounds(
                max_attempts=v.ROUTES_MAX_ATTEMPTS.read(env),
                max_wait_s=v.ROUTES_MAX_WAIT_S.read(env),
            ),
            budget_default_max_tokens=v.BUDGET_DEFAULT_MAX_TOKENS.read(env),
            limits_hold_ttl_s=v.LIMITS_HOLD_TTL_S.read(env),
        )
        settings.key_ring()  # a key or a name in both sources stops the start
        return settings


def check_provider_env(env: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError`, naming the variable, for a provider credential or base URL
    the gateway could not send: a credential goes into a request header (``Authorization:
    Bearer KEY``, ``x-api-key: KEY``, ...), a base URL gives the host and the path. Checked at
    start, so that no request meets it (each was a 500). A credential is never repeated, a URL
    only without its user and password. Only the variables a provider reads are checked."""
    specs = [get_provider(name) for name in provider_names()]
    keys = sorted({spec.api_key_env for spec in specs if spec.api_key_env})
    urls = sorted({_SCRIPTED_BASE_URL, *(spec.base_url_env for spec in specs)})
    for name in keys:
        try:
            check_header("authorization", env.get(name, ""))
        except ValueError:
            raise ConfigError(name, "[redacted]", _NOT_A_HEADER) from None
    _check_each(env, urls, check_url)


_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
"""Where the provider client finds its proxies (``urllib.request.getproxies_environment``)."""


def check_proxy_env(env: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError`, naming the variable, for a proxy the provider client cannot
    use (an ``https://`` proxy, no host, a bad port): checked at start, as every request
    through it would fail. The URL is shown without its user and password."""
    _check_each(env, _PROXY_VARS, check_proxy)


def _check_each(env: Mapping[str, str], names: Iterable[str], check: Callable[[str], None]) -> None:
    """``check`` each URL variable set in ``env``; :class:`ConfigError` naming the first it
    refuses, the URL shown without its user and password."""
    for name in names:
        if value := env.get(name):
            try:
                check(value)
            except ValueError as exc:
                raise ConfigError(name, _without_credentials(value), str(exc)) from None


def _without_credentials(url: str) -> str:
    """``url`` without ``user:password@``, with or without a scheme (a proxy may have none)."""
    return without_userinfo(url) if "://" in url else url.rpartition("@")[2]


def framing_from_env(env: Mapping[str, str]) -> FramePolicy:
    """``TOKENWIRE_FRAMES`` (true/false) and ``TOKENWIRE_FRAME_LINGER_MS`` (0 to 1000)."""
    return FramePolicy(frames=v.FRAMES.read(env), linger_ms=v.FRAME_LINGER_MS.read(env))


def _edge(env: Mapping[str, str]) -> EdgeLimits:
    """``TOKENWIRE_GATEWAY_MAX_HEADER_BYTES`` and the other edge bounds."""
    return EdgeLimits(
        max_header_bytes=v.GATEWAY_MAX_HEADER_BYTES.read(env),
        max_headers=v.GATEWAY_MAX_HEADERS.read(env),
        header_timeout_s=v.GATEWAY_HEADER_TIMEOUT_S.read(env),
        body_timeout_s=v.GATEWAY_BODY_TIMEOUT_S.read(env),
        max_connections=v.GATEWAY_MAX_CONNECTIONS.read(env),
        max_requests=v.GATEWAY_MAX_REQUESTS.read(env),
    )
