"""The one definition of every tokenwire setting: its variable, parser, default and flag.

Each row (a :class:`Variable`) is an environment variable some command reads. It states once
how the variable's text is parsed (``parse``) and what it is when unset (``default``, written
as the variable's own text and parsed by the same parser): :meth:`Variable.read` is the one
place a value is parsed, :attr:`Variable.value` the default every settings class starts from
(starlette's ``config("KEY", cast=int, default=...)``, stated once). The readers are
``tokenwire.config.load`` for the shared rows and each service's ``from_env`` for its own; a
test fails when any other module names a variable as a string.

The CLI turns each row into a flag of every command it names (``tokenwire.cli._flags``), and
docs/configuration.md carries :func:`reference_markdown` between its ``settings`` markers (a
test fails when they differ). Run ``python -m tokenwire.variables`` to print the table;
the parsers are in ``_parse.py``.
"""

from __future__ import annotations

import typing

from tokenwire.variables._limits import BUDGET_DEFAULT_MAX_TOKENS, LIMITS_HOLD_TTL_S
from tokenwire.variables._parse import (
    COMPRESSIONS,
    MAX_COALESCE_MS,
    MAX_LINGER_MS,
    MAX_REGISTRY_SHARDS,
    ConfigError,
    choice,
    integer,
    key_list,
    names,
    nats_urls,
    optional_addr,
    optional_flag,
    parse_addr,
    parse_bytes,
    parse_flag,
    parse_int,
    parse_seconds,
    seconds_at_least,
    text,
)
from tokenwire.variables._routes import (
    ROUTES_FILE,
    ROUTES_MAX_ATTEMPTS,
    ROUTES_MAX_WAIT_S,
    ROUTES_RELOAD_S,
)
from tokenwire.variables._variable import Variable

_BROKER_TOOLS = ("gateway", "assembler", "telemetry", "provision", "reshard", "limits")
BROKER_COMMANDS = ("replay", "tail", "status", "rebuild", *_BROKER_TOOLS)
READ_COMMANDS = ("replay", "tail", "messages", "status", "rebuild", "usage")
STACK_COMMANDS = ("demo", "up")
PROVISIONING = ("gateway", "assembler", "telemetry", "provision", "reshard", *STACK_COMMANDS)
"""The commands that create or update streams (and so apply the retention and placement)."""
SERVICE_COMMANDS = ("gateway", "assembler", "telemetry", "scripted-provider", *STACK_COMMANDS)
"""The long-running commands (the stop bound's)."""


NATS_URL: Variable[tuple[str, ...]] = Variable(
    env="TOKENWIRE_NATS_URL",
    flag="nats-url",
    parse=nats_urls,
    default="",
    meaning=(
        "NATS server URLs, comma-separated. Absent: `demo`/`up` start the embedded server and"
        " record its URL in the data directory, where the read commands find it; the services"
        " refuse to start."
    ),
    commands=BROKER_COMMANDS,
)
STORE: Variable[str] = Variable(
    env="TOKENWIRE_STORE",
    flag="store",
    parse=text,
    default="",
    shown="`sqlite:///<data dir>/store.db`",
    meaning=("`sqlite:///PATH` or `postgresql://user:password@host:5432/db`."),
    commands=(
        "replay",
        "messages",
        "status",
        "rebuild",
        "usage",
        "gateway",
        "assembler",
        *STACK_COMMANDS,
    ),
)
DATA_DIR: Variable[str] = Variable(
    env="TOKENWIRE_DATA_DIR",
    flag="data-dir",
    parse=text,
    default="./.tokenwire",
    meaning=("Embedded broker data, the SQLite file, the recorded NATS URL (`nats.url`)."),
    commands=(*READ_COMMANDS, *STACK_COMMANDS, "gateway", "assembler"),
)
PARTITIONS: Variable[int] = Variable(
    env="TOKENWIRE_PARTITIONS",
    flag="partitions",
    parse=integer(1),
    default="16",
    meaning=("Session partitions of the chunk stream; the same in every process of a deployment."),
    commands=(*BROKER_COMMANDS, *STACK_COMMANDS),
)
SHARDS: Variable[int] = Variable(
    env="TOKENWIRE_SHARDS",
    flag="shards",
    parse=integer(1),
    default="1",
    meaning=(
        "Chunk streams (K, 1 to `TOKENWIRE_PARTITIONS`), each its own raft group owning the "
        "partitions `[k*P//K, (k+1)*P//K)`; the same in every process. Changing it on a "
        "running deployment: `tokenwire reshard` (docs/operations.md)."
    ),
    commands=(*BROKER_COMMANDS, *STACK_COMMANDS),
)
SHARD_TAGS: Variable[tuple[str, ...]] = Variable(
    env="TOKENWIRE_SHARD_TAGS",
    flag="shard-tags",
    parse=names,
    default="",
    meaning=(
        "Comma-separated JetStream placement tags: shard k's stream is placed on servers "
        "tagged `tags[k mod n]`. Absent: JetStream places each shard, and provisioning "
        "spreads the leaders over the nodes."
    ),
    commands=PROVISIONING,
)
REGISTRY_SHARDS: Variable[int] = Variable(
    env="TOKENWIRE_REGISTRY_SHARDS",
    flag="registry-shards",
    parse=integer(1, MAX_REGISTRY_SHARDS),
    default="1",
    meaning=(
        "Step-registry KV buckets and session-events streams (R of each, 1 to 64), each its "
        "own raft group holding the sessions that hash to it; the same in every process. "
        "Fixed per deployment: provisioning refuses another R (docs/operations.md)."
    ),
    commands=(*PROVISIONING, "status"),
)
REPLICAS: Variable[int] = Variable(
    env="TOKENWIRE_REPLICAS",
    flag="replicas",
    parse=integer(1, 5),
    default="1",
    meaning=("JetStream replicas of the streams and the KV buckets (1 to 5)."),
    commands=("gateway", "assembler", "telemetry", "provision", "reshard"),
)
RETENTION_BYTES: Variable[int] = Variable(
    env="TOKENWIRE_RETENTION_BYTES",
    flag="retention-bytes",
    parse=parse_bytes,
    default="4GiB",
    meaning=(
        "Byte budget of the retained chunks, split evenly over the shards (each stream's "
        "`max_bytes` is budget / K); the events and dead-letter streams get an eighth each. "
        "`tokenwire status` says how many hours of replay it holds."
    ),
    commands=PROVISIONING,
)
RETENTION_AGE_S: Variable[float] = Variable(
    env="TOKENWIRE_RETENTION_AGE_S",
    flag="retention-age-s",
    parse=parse_seconds,
    default="604800",
    meaning=("Seconds a chunk (and a claimed step) is kept at most (7 days)."),
    commands=PROVISIONING,
)
COMPRESSION: Variable[str] = Variable(
    env="TOKENWIRE_COMPRESSION",
    flag="compression",
    parse=choice(COMPRESSIONS),
    default="s2",
    meaning=("Chunk stream compression on disk: `s2` or `none` (ADR 0023)."),
    commands=PROVISIONING,
)
PROVISION: Variable[bool] = Variable(
    env="TOKENWIRE_PROVISION",
    flag="provision",
    parse=parse_flag,
    default="1",
    meaning=(
        "`0`: the gateway and the telemetry consumer do not create or update the topology at start."
    ),
    commands=("gateway", "telemetry"),
)
CONNECT_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_CONNECT_TIMEOUT_S",
    flag="connect-timeout-s",
    parse=parse_seconds,
    default="5",
    meaning=(
        "Seconds the first connection to the broker and to the store may take before the "
        "command fails with one line naming the URL (exit 1). Later reconnects keep their own"
        " bounds."
    ),
    commands=(*BROKER_COMMANDS, "messages", "usage"),
)
STOP_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_STOP_TIMEOUT_S",
    flag="stop-timeout-s",
    parse=seconds_at_least(1.0),
    default="25",
    meaning=(
        "Seconds a service takes at most to exit after SIGINT/SIGTERM, whether or not the "
        "broker and the store answer: its graceful stop is cut 2 s before (cancelled), and at "
        "the bound it logs what it leaves unflushed and exits 130/143 (nothing acknowledged is "
        "lost). `up`/`demo` give it to their services and exit at most 15 s after it (at "
        "least 1)."
    ),
    commands=SERVICE_COMMANDS,
)
GATEWAY_ADDR: Variable[tuple[str, int]] = Variable(
    env="TOKENWIRE_GATEWAY_ADDR",
    flag="gateway-addr",
    parse=parse_addr,
    default="127.0.0.1:8080",
    meaning=("`HOST:PORT` the gateway listens on (`[::1]:PORT` for IPv6)."),
    commands=("gateway", *STACK_COMMANDS),
)
GATEWAY_KEYS: Variable[frozenset[str]] = Variable(
    env="TOKENWIRE_GATEWAY_KEYS",
    flag="gateway-keys",
    parse=key_list,
    default="",
    meaning=(
        "Comma-separated keys accepted as `Authorization: Bearer` or `x-api-key`, each an "
        "operator (reads every session) named `key-<8 hex of its SHA-256>`. Absent (and no "
        "keys file): loopback only. Prefer the variable: a flag is visible to other local "
        "users."
    ),
    commands=("gateway", *STACK_COMMANDS),
    secret=True,
)
GATEWAY_KEYS_FILE: Variable[str] = Variable(
    env="TOKENWIRE_GATEWAY_KEYS_FILE",
    flag="gateway-keys-file",
    parse=text,
    default="",
    meaning=(
        "TOML file of named keys (`[[keys]]` with `name`, `sha256`, optional `tenant`, "
        "`scope` `tenant` or `operator`; `tokenwire keys hash` makes the hash). A tenant key "
        "reads only its tenant's sessions. Absent (and no `TOKENWIRE_GATEWAY_KEYS`): loopback"
        " only."
    ),
    commands=("gateway", *STACK_COMMANDS),
)
GATEWAY_METRICS_KEY: Variable[str] = Variable(
    env="TOKENWIRE_GATEWAY_METRICS_KEY",
    flag="metrics-key",
    parse=text,
    default="",
    meaning=(
        "When set, `GET /metrics` answers only a scrape carrying it as `Authorization: "
        "Bearer` (Prometheus's `authorization` setting); absent: `/metrics` is open (its "
        "labels are route templates and bounded sets, never ids)."
    ),
    commands=("gateway",),
    secret=True,
)
GATEWAY_MAX_BODY_BYTES: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_BODY_BYTES",
    flag="max-body-bytes",
    parse=integer(1024),
    default="8388608",
    meaning=("Larger request bodies get 413 (at least 1024)."),
    commands=("gateway",),
)
GATEWAY_CONTINUE_ON_DISCONNECT: Variable[bool] = Variable(
    env="TOKENWIRE_GATEWAY_CONTINUE_ON_DISCONNECT",
    flag="continue-on-disconnect",
    parse=parse_flag,
    default="true",
    meaning=("Keep reading the provider after the caller left; `false`: `finish {aborted}`."),
    commands=("gateway",),
)
GATEWAY_THREADING: Variable[bool] = Variable(
    env="TOKENWIRE_GATEWAY_THREADING",
    flag="threading",
    parse=parse_flag,
    default="true",
    meaning=(
        "Thread a request without `X-Tokenwire-Session` into the session whose answer it "
        "continues (by tool-call id, Responses `previous_response_id` or content; one registry"
        ' read a request); `false`: a new session each (docs/gateway.md, "Threading").'
    ),
    commands=("gateway",),
)
GATEWAY_DROP_PARAMS: Variable[bool] = Variable(
    env="TOKENWIRE_GATEWAY_DROP_PARAMS",
    flag="drop-params",
    parse=parse_flag,
    default="false",
    meaning=(
        "`true`: request fields that cannot be translated to the route's dialect are dropped "
        "(listed in `x-tokenwire-dropped-params`) instead of refused with 400; "
        "`TOKENWIRE_<PROVIDER>_DROP_PARAMS` does the same for one provider's routes."
    ),
    commands=("gateway", *STACK_COMMANDS),
)
GATEWAY_MAX_STEP_BYTES: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_STEP_BYTES",
    flag="max-step-bytes",
    parse=integer(2),
    default="16777216",
    meaning=(
        "Content bytes of one step; any block up to this is captured, past it a recorded "
        "`limit` error."
    ),
    commands=("gateway",),
)
GATEWAY_MAX_STEP_CHUNKS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_STEP_CHUNKS",
    flag="max-step-chunks",
    parse=integer(2),
    default="100000",
    meaning=("Published chunks of one step; past it a recorded `limit` error."),
    commands=("gateway",),
)
GATEWAY_MAX_STEP_SECONDS: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_STEP_SECONDS",
    flag="max-step-seconds",
    parse=parse_seconds,
    default="600",
    meaning=("Seconds one step may read its provider; past it a recorded `limit` error."),
    commands=("gateway",),
)
GATEWAY_MAX_STEP_IDLE_SECONDS: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_STEP_IDLE_SECONDS",
    flag="max-step-idle-seconds",
    parse=parse_seconds,
    default="60",
    meaning=("Seconds one step may go without a chunk; past it a recorded `limit` error."),
    commands=("gateway",),
)
GATEWAY_STEP_RETRIES: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_STEP_RETRIES",
    flag="step-retries",
    parse=integer(0),
    default="16",
    meaning=(
        "Retries of one step assignment while the step bucket has no leader (a KV leader "
        "election); past them, or past `TOKENWIRE_GATEWAY_STEP_RETRY_S`, the step gets 503 "
        "with `retry-after` (0: no retry)."
    ),
    commands=("gateway",),
)
GATEWAY_STEP_RETRY_S: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_STEP_RETRY_S",
    flag="step-retry-s",
    parse=parse_seconds,
    default="30",
    meaning=(
        "Seconds one step assignment may spend on those retries (the caller waits for its "
        "first chunk meanwhile)."
    ),
    commands=("gateway",),
)
FRAMES: Variable[bool] = Variable(
    env="TOKENWIRE_FRAMES",
    flag="frames",
    parse=parse_flag,
    default="true",
    meaning=(
        "Publish a step's consecutive chunks in frames, several per broker message (schema "
        "version 2); `false`: one version-1 message per chunk (for a rolling upgrade: readers"
        " first, then frames)."
    ),
    commands=("gateway", *STACK_COMMANDS),
)
FRAME_LINGER_MS: Variable[int] = Variable(
    env="TOKENWIRE_FRAME_LINGER_MS",
    flag="frame-linger-ms",
    parse=integer(0, MAX_LINGER_MS),
    default="200",
    meaning=(
        "How long a frame may wait for more chunks of its step before it is published (0 to "
        "1000; 0: each provider read's chunks go at once). Never delays the caller's stream; "
        "a step's first chunk and its end go at once."
    ),
    commands=("gateway", *STACK_COMMANDS),
)
GATEWAY_COALESCE_MS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_COALESCE_MS",
    flag="coalesce-ms",
    parse=integer(0, MAX_COALESCE_MS),
    default="0",
    meaning=(
        "The default wait in ms before each provider read past a step's first (0 to 1000; 0: "
        "none). For agent fleets that act on whole messages: later tokens reach the caller up"
        " to that much later, several per write, for less CPU per token. A request's "
        "`x-tokenwire-coalesce-ms` overrides it; the answer says what was applied "
        "(docs/gateway.md, ADR 0032)."
    ),
    commands=("gateway",),
)
GATEWAY_MAX_RESUMERS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_RESUMERS",
    flag="max-resumers",
    parse=integer(1),
    default="8",
    meaning=(
        "Callers resuming one step at once on a gateway (a retried step, `GET "
        "/v1/responses/{id}`); past it 429 with `retry-after`."
    ),
    commands=("gateway",),
)
GATEWAY_IDEMPOTENCY_TTL_S: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_IDEMPOTENCY_TTL_S",
    flag="idempotency-ttl-s",
    parse=parse_seconds,
    default="86400",
    meaning=("Seconds an `Idempotency-Key` maps to its step; after it the key starts a new step."),
    commands=("gateway",),
)
GATEWAY_MAX_READERS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_READERS",
    flag="max-readers",
    parse=integer(1),
    default="256",
    meaning=(
        "Session event streams (`GET /v1/sessions/{session}/events`, the viewer) open at "
        "once, each a bounded broker read; past it 503 with `retry-after` (at least 1)."
    ),
    commands=("gateway",),
)
GATEWAY_MAX_HEADER_BYTES: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_HEADER_BYTES",
    flag="max-header-bytes",
    parse=integer(2),
    default="65536",
    meaning=("Request line and headers of one request; past it 431."),
    commands=("gateway",),
)
GATEWAY_MAX_HEADERS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_HEADERS",
    flag="max-headers",
    parse=integer(2),
    default="100",
    meaning=("Headers of one request; past it 431."),
    commands=("gateway",),
)
GATEWAY_HEADER_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_HEADER_TIMEOUT_S",
    flag="header-timeout-s",
    parse=parse_seconds,
    default="10",
    meaning=("First byte to the end of the headers; past it 408."),
    commands=("gateway",),
)
GATEWAY_BODY_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_GATEWAY_BODY_TIMEOUT_S",
    flag="body-timeout-s",
    parse=parse_seconds,
    default="30",
    meaning=("End of the headers to the end of the body; past it 408."),
    commands=("gateway",),
)
GATEWAY_MAX_CONNECTIONS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_CONNECTIONS",
    flag="max-connections",
    parse=integer(2),
    default="4096",
    meaning=("Open connections at once; past it 503 with `retry-after`."),
    commands=("gateway",),
)
GATEWAY_MAX_REQUESTS: Variable[int] = Variable(
    env="TOKENWIRE_GATEWAY_MAX_REQUESTS",
    flag="max-requests",
    parse=integer(2),
    default="2048",
    meaning=("Running requests at once; past it 503 with `retry-after`."),
    commands=("gateway",),
)
ASSEMBLER_METRICS_ADDR: Variable[tuple[str, int] | None] = Variable(
    env="TOKENWIRE_ASSEMBLER_METRICS_ADDR",
    flag="metrics-addr",
    parse=optional_addr,
    default="127.0.0.1:9465",
    meaning=("Assembler metrics and probes; `off` disables."),
    commands=("assembler",),
)
ASSEMBLER_BATCH_STEPS: Variable[int] = Variable(
    env="TOKENWIRE_ASSEMBLER_BATCH_STEPS",
    flag="batch-steps",
    parse=integer(1),
    default="256",
    meaning=("Commit when this many steps closed ..."),
    commands=("assembler",),
)
ASSEMBLER_BATCH_MS: Variable[int] = Variable(
    env="TOKENWIRE_ASSEMBLER_BATCH_MS",
    flag="batch-ms",
    parse=integer(1),
    default="20",
    meaning=("... or when the oldest closed step waited this long."),
    commands=("assembler",),
)
ASSEMBLER_GAP_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_GAP_TIMEOUT_S",
    flag="gap-timeout-s",
    parse=parse_seconds,
    default="30",
    meaning=("Finish seen, chunks missing: close the step as `gap`."),
    commands=("assembler", "rebuild"),
)
ASSEMBLER_ABANDON_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_ABANDON_TIMEOUT_S",
    flag="abandon-timeout-s",
    parse=parse_seconds,
    default="120",
    meaning=("No finish and no chunk for this long: close as `abandoned`."),
    commands=("assembler", "rebuild"),
)
ASSEMBLER_MAX_OPEN_STEPS: Variable[int] = Variable(
    env="TOKENWIRE_ASSEMBLER_MAX_OPEN_STEPS",
    flag="max-open-steps",
    parse=integer(1),
    default="20000",
    meaning=("Steps held in memory; at the bound the instance stops pulling."),
    commands=("assembler",),
)
ASSEMBLER_ACK_WAIT_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_ACK_WAIT_S",
    flag="ack-wait-s",
    parse=parse_seconds,
    default="300",
    meaning=(
        "Consumer `ack_wait`: when an unacknowledged message comes back (a dead owner's, at "
        "once by a consumer reset on nats-server 2.14+)."
    ),
    commands=("assembler",),
)
ASSEMBLER_PRIORITY_TIMEOUT_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_PRIORITY_TIMEOUT_S",
    flag="priority-timeout-s",
    parse=parse_seconds,
    default="5",
    meaning=("A partition's pin moves to a standby after this long without pulls."),
    commands=("assembler",),
)
ASSEMBLER_HEARTBEAT_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_HEARTBEAT_S",
    flag="heartbeat-s",
    parse=parse_seconds,
    default="1",
    meaning=("Membership heartbeat period (ADR 0016)."),
    commands=("assembler",),
)
ASSEMBLER_MEMBER_TTL_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_MEMBER_TTL_S",
    flag="member-ttl-s",
    parse=parse_seconds,
    default="6",
    meaning=(
        "The broker drops a member silent this long (at least two heartbeats and the priority"
        " timeout)."
    ),
    commands=("assembler",),
)
ASSEMBLER_READY_MAX_LAG_S: Variable[float] = Variable(
    env="TOKENWIRE_ASSEMBLER_READY_MAX_LAG_S",
    flag="ready-max-lag-s",
    parse=parse_seconds,
    default="60",
    meaning=(
        "Not ready (`/readyz` 503, reason `lag`) while a held partition's undelivered messages"
        " have waited this long without a delivery."
    ),
    commands=("assembler",),
)
ASSEMBLER_MEMBER: Variable[str] = Variable(
    env="TOKENWIRE_ASSEMBLER_MEMBER",
    flag="member",
    parse=text,
    default="",
    shown="`<host>-<pid>-<random>`",
    meaning=("This instance's member name (shares are assigned in name order)."),
    commands=("assembler",),
)
ASSEMBLER_PROVISION: Variable[bool | None] = Variable(
    env="TOKENWIRE_ASSEMBLER_PROVISION",
    flag="provision",
    parse=optional_flag,
    default="",
    shown="`TOKENWIRE_PROVISION`",
    meaning=("Create/update the streams and consumers at start; `0`: leave them."),
    commands=("assembler",),
)
ASSEMBLER_BURST: Variable[bool] = Variable(
    env="TOKENWIRE_ASSEMBLER_BURST",
    flag="burst",
    parse=parse_flag,
    default="0",
    meaning=("`1`: drain what the stream holds, commit, exit."),
    commands=("assembler",),
    switch=True,
)
ASSEMBLER_TUNE_GC: Variable[bool] = Variable(
    env="TOKENWIRE_ASSEMBLER_TUNE_GC",
    flag="tune-gc",
    parse=parse_flag,
    default="1",
    meaning=("Apply the assembler's GC policy at start; `0`: the interpreter's defaults."),
    commands=("assembler",),
)
TELEMETRY_METRICS_ADDR: Variable[tuple[str, int]] = Variable(
    env="TOKENWIRE_TELEMETRY_METRICS_ADDR",
    flag="metrics-addr",
    parse=parse_addr,
    default="127.0.0.1:9466",
    meaning=("Where the telemetry consumer's `/metrics` listens."),
    commands=("telemetry",),
)

VARIABLES: tuple[Variable[typing.Any], ...] = (
    NATS_URL,
    STORE,
    DATA_DIR,
    PARTITIONS,
    SHARDS,
    SHARD_TAGS,
    REGISTRY_SHARDS,
    REPLICAS,
    RETENTION_BYTES,
    RETENTION_AGE_S,
    COMPRESSION,
    PROVISION,
    CONNECT_TIMEOUT_S,
    STOP_TIMEOUT_S,
    GATEWAY_ADDR,
    GATEWAY_KEYS,
    GATEWAY_KEYS_FILE,
    GATEWAY_METRICS_KEY,
    GATEWAY_MAX_BODY_BYTES,
    GATEWAY_CONTINUE_ON_DISCONNECT,
    GATEWAY_THREADING,
    GATEWAY_DROP_PARAMS,
    GATEWAY_MAX_STEP_BYTES,
    GATEWAY_MAX_STEP_CHUNKS,
    GATEWAY_MAX_STEP_SECONDS,
    GATEWAY_MAX_STEP_IDLE_SECONDS,
    GATEWAY_STEP_RETRIES,
    GATEWAY_STEP_RETRY_S,
    FRAMES,
    FRAME_LINGER_MS,
    GATEWAY_COALESCE_MS,
    GATEWAY_MAX_RESUMERS,
    GATEWAY_IDEMPOTENCY_TTL_S,
    GATEWAY_MAX_READERS,
    ROUTES_FILE,
    ROUTES_RELOAD_S,
    ROUTES_MAX_ATTEMPTS,
    ROUTES_MAX_WAIT_S,
    BUDGET_DEFAULT_MAX_TOKENS,
    LIMITS_HOLD_TTL_S,
    GATEWAY_MAX_HEADER_BYTES,
    GATEWAY_MAX_HEADERS,
    GATEWAY_HEADER_TIMEOUT_S,
    GATEWAY_BODY_TIMEOUT_S,
    GATEWAY_MAX_CONNECTIONS,
    GATEWAY_MAX_REQUESTS,
    ASSEMBLER_METRICS_ADDR,
    ASSEMBLER_BATCH_STEPS,
    ASSEMBLER_BATCH_MS,
    ASSEMBLER_GAP_TIMEOUT_S,
    ASSEMBLER_ABANDON_TIMEOUT_S,
    ASSEMBLER_MAX_OPEN_STEPS,
    ASSEMBLER_ACK_WAIT_S,
    ASSEMBLER_PRIORITY_TIMEOUT_S,
    ASSEMBLER_HEARTBEAT_S,
    ASSEMBLER_MEMBER_TTL_S,
    ASSEMBLER_MEMBER,
    ASSEMBLER_READY_MAX_LAG_S,
    ASSEMBLER_PROVISION,
    ASSEMBLER_BURST,
    ASSEMBLER_TUNE_GC,
    TELEMETRY_METRICS_ADDR,
)

"""Every row; provider base URLs (``TOKENWIRE_<PROVIDER>_BASE_URL``) and keys
(``<PROVIDER>_API_KEY``) are a family documented with the providers, not flags."""


def for_command(command: str) -> tuple[Variable[typing.Any], ...]:
    """The rows ``command`` takes as flags, in table order."""
    return tuple(v for v in VARIABLES if command in v.commands)


def reference_markdown() -> str:
    """The reference table docs/configuration.md carries between its ``settings`` markers."""
    lines = ["| variable | flag | default | commands | meaning |", "| --- " * 5 + "|"]
    for v in VARIABLES:
        commands = ", ".join(f"`{c}`" for c in v.commands)
        lines.append(f"| `{v.env}` | `--{v.flag}` | {v.shown_default} | {commands} | {v.meaning} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "ASSEMBLER_ABANDON_TIMEOUT_S",
    "ASSEMBLER_ACK_WAIT_S",
    "ASSEMBLER_BATCH_MS",
    "ASSEMBLER_BATCH_STEPS",
    "ASSEMBLER_BURST",
    "ASSEMBLER_GAP_TIMEOUT_S",
    "ASSEMBLER_HEARTBEAT_S",
    "ASSEMBLER_MAX_OPEN_STEPS",
    "ASSEMBLER_MEMBER",
    "ASSEMBLER_MEMBER_TTL_S",
    "ASSEMBLER_METRICS_ADDR",
    "ASSEMBLER_PRIORITY_TIMEOUT_S",
    "ASSEMBLER_PROVISION",
    "ASSEMBLER_READY_MAX_LAG_S",
    "ASSEMBLER_TUNE_GC",
    "BROKER_COMMANDS",
    "BUDGET_DEFAULT_MAX_TOKENS",
    "COMPRESSION",
    "COMPRESSIONS",
    "CONNECT_TIMEOUT_S",
    "DATA_DIR",
    "FRAMES",
    "FRAME_LINGER_MS",
    "GATEWAY_ADDR",
    "GATEWAY_BODY_TIMEOUT_S",
    "GATEWAY_COALESCE_MS",
    "GATEWAY_CONTINUE_ON_DISCONNECT",
    "GATEWAY_DROP_PARAMS",
    "GATEWAY_HEADER_TIMEOUT_S",
    "GATEWAY_IDEMPOTENCY_TTL_S",
    "GATEWAY_KEYS",
    "GATEWAY_KEYS_FILE",
    "GATEWAY_MAX_BODY_BYTES",
    "GATEWAY_MAX_CONNECTIONS",
    "GATEWAY_MAX_HEADERS",
    "GATEWAY_MAX_HEADER_BYTES",
    "GATEWAY_MAX_READERS",
    "GATEWAY_MAX_REQUESTS",
    "GATEWAY_MAX_RESUMERS",
    "GATEWAY_MAX_STEP_BYTES",
    "GATEWAY_MAX_STEP_CHUNKS",
    "GATEWAY_MAX_STEP_IDLE_SECONDS",
    "GATEWAY_MAX_STEP_SECONDS",
    "GATEWAY_METRICS_KEY",
    "GATEWAY_STEP_RETRIES",
    "GATEWAY_STEP_RETRY_S",
    "GATEWAY_THREADING",
    "LIMITS_HOLD_TTL_S",
    "MAX_COALESCE_MS",
    "MAX_LINGER_MS",
    "MAX_REGISTRY_SHARDS",
    "NATS_URL",
    "PARTITIONS",
    "PROVISION",
    "PROVISIONING",
    "READ_COMMANDS",
    "REGISTRY_SHARDS",
    "REPLICAS",
    "RETENTION_AGE_S",
    "RETENTION_BYTES",
    "ROUTES_FILE",
    "ROUTES_MAX_ATTEMPTS",
    "ROUTES_MAX_WAIT_S",
    "ROUTES_RELOAD_S",
    "SERVICE_COMMANDS",
    "SHARDS",
    "SHARD_TAGS",
    "STACK_COMMANDS",
    "STOP_TIMEOUT_S",
    "STORE",
    "TELEMETRY_METRICS_ADDR",
    "VARIABLES",
    "ConfigError",
    "Variable",
    "choice",
    "for_command",
    "integer",
    "key_list",
    "names",
    "nats_urls",
    "optional_addr",
    "optional_flag",
    "parse_addr",
    "parse_bytes",
    "parse_flag",
    "parse_int",
    "parse_seconds",
    "reference_markdown",
    "seconds_at_least",
    "text",
]
