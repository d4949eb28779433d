"""The one definition of every tokenwire setting: its variable, its flag, which commands take it.

Each row is an environment variable that some command reads; the CLI turns each row into a
flag of every command it names (``tokenwire.cli._flags``), and docs/configuration.md carries
:func:`reference_markdown` between its ``settings`` markers (a test fails when they differ).
A flag given on the command line is applied as the variable for that invocation, so the
readers (``tokenwire.config.load``, the services' ``from_env``) have one source and validate
flags and variables with the same parser.

Run ``python -m tokenwire.variables`` to print the reference table.
"""

from __future__ import annotations

from dataclasses import dataclass

BROKER_COMMANDS = ("replay", "tail", "status", "rebuild", "gateway", "assembler", "telemetry",
                   "provision", "reshard")  # fmt: skip
READ_COMMANDS = ("replay", "tail", "messages", "status", "rebuild", "usage")
STACK_COMMANDS = ("demo", "up")
PROVISIONING = ("gateway", "assembler", "telemetry", "provision", "reshard", *STACK_COMMANDS)
"""The commands that create or update streams (and so apply the retention and placement)."""


@dataclass(frozen=True)
class Variable:
    """One setting. ``flag`` is the option name without ``--``; ``switch``: a flag without a
    value that sets the variable to ``1``; ``secret``: its value is never shown."""

    env: str
    flag: str
    default: str
    meaning: str
    commands: tuple[str, ...]
    switch: bool = False
    secret: bool = False


VARIABLES: tuple[Variable, ...] = (
    Variable("TOKENWIRE_NATS_URL", "nats-url", "absent",
             "NATS server URLs, comma-separated. Absent: `demo`/`up` start the embedded server "
             "and record its URL in the data directory, where the read commands find it; the "
             "services refuse to start.", BROKER_COMMANDS),
    Variable("TOKENWIRE_STORE", "store", "`sqlite:///<data dir>/store.db`",
             "`sqlite:///PATH` or `postgresql://user:password@host:5432/db`.",
             ("replay", "messages", "status", "rebuild", "usage", "gateway", "assembler",
              *STACK_COMMANDS)),
    Variable("TOKENWIRE_DATA_DIR", "data-dir", "`./.tokenwire`",
             "Embedded broker data, the SQLite file, the recorded NATS URL (`nats.url`).",
             (*READ_COMMANDS, *STACK_COMMANDS, "gateway", "assembler")),
    Variable("TOKENWIRE_PARTITIONS", "partitions", "`16`",
             "Session partitions of the chunk stream; the same in every process of a "
             "deployment.", (*BROKER_COMMANDS, *STACK_COMMANDS)),
    Variable("TOKENWIRE_SHARDS", "shards", "`1`",
             "Chunk streams (K, 1 to `TOKENWIRE_PARTITIONS`), each its own raft group owning "
             "the partitions `[k*P//K, (k+1)*P//K)`; the same in every process. Changing it on "
             "a running deployment: `tokenwire reshard` (docs/operations.md).",
             (*BROKER_COMMANDS, *STACK_COMMANDS)),
    Variable("TOKENWIRE_SHARD_TAGS", "shard-tags", "absent",
             "Comma-separated JetStream placement tags: shard k's stream is placed on servers "
             "tagged `tags[k mod n]`. Absent: JetStream places each shard, and provisioning "
             "spreads the leaders over the nodes.", PROVISIONING),
    Variable("TOKENWIRE_REGISTRY_SHARDS", "registry-shards", "`1`",
             "Step-registry KV buckets and session-events streams (R of each, 1 to 64), each "
             "its own raft group holding the sessions that hash to it; the same in every "
             "process. Fixed per deployment: provisioning refuses another R "
             "(docs/operations.md).", (*PROVISIONING, "status")),
    Variable("TOKENWIRE_REPLICAS", "replicas", "`1`",
             "JetStream replicas of the streams and the KV buckets (1 to 5).",
             ("gateway", "assembler", "telemetry", "provision", "reshard")),
    Variable("TOKENWIRE_RETENTION_BYTES", "retention-bytes", "`4GiB`",
             "Byte budget of the retained chunks, split evenly over the shards (each stream's "
             "`max_bytes` is budget / K); the events and dead-letter streams get an eighth "
             "each. `tokenwire status` says how many hours of replay it holds.", PROVISIONING),
    Variable("TOKENWIRE_RETENTION_AGE_S", "retention-age-s", "`604800`",
             "Seconds a chunk (and a claimed step) is kept at most (7 days).", PROVISIONING),
    Variable("TOKENWIRE_COMPRESSION", "compression", "`s2`",
             "Chunk stream compression on disk: `s2` or `none` (ADR 0023).", PROVISIONING),
    Variable("TOKENWIRE_PROVISION", "provision", "`1`",
             "`0`: the gateway and the telemetry consumer do not create or update the topology "
             "at start.", ("gateway", "telemetry")),
    Variable("TOKENWIRE_CONNECT_TIMEOUT_S", "connect-timeout-s", "`5`",
             "Seconds the first connection to the broker and to the store may take before the "
             "command fails with one line naming the URL (exit 1). Later reconnects keep their "
             "own bounds.", (*BROKER_COMMANDS, "messages", "usage")),
    Variable("TOKENWIRE_GATEWAY_ADDR", "gateway-addr", "`127.0.0.1:8080`",
             "`HOST:PORT` the gateway listens on (`[::1]:PORT` for IPv6).",
             ("gateway", *STACK_COMMANDS)),
    Variable("TOKENWIRE_GATEWAY_KEYS", "gateway-keys", "absent",
             "Comma-separated keys accepted as `Authorization: Bearer` or `x-api-key`, each an "
             "operator (reads every session) named `key-<8 hex of its SHA-256>`. Absent (and "
             "no keys file): loopback only. Prefer the variable: a flag is visible to other "
             "local users.",
             ("gateway", *STACK_COMMANDS), secret=True),
    Variable("TOKENWIRE_GATEWAY_KEYS_FILE", "gateway-keys-file", "absent",
             "TOML file of named keys (`[[keys]]` with `name`, `sha256`, optional `tenant`, "
             "`scope` `tenant` or `operator`; `tokenwire keys hash` makes the hash). A tenant "
             "key reads only its tenant's sessions. Absent (and no `TOKENWIRE_GATEWAY_KEYS`): "
             "loopback only.", ("gateway", *STACK_COMMANDS)),
    Variable("TOKENWIRE_GATEWAY_MAX_BODY_BYTES", "max-body-bytes", "`8388608`",
             "Larger request bodies get 413 (at least 1024).", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_CONTINUE_ON_DISCONNECT", "continue-on-disconnect", "`true`",
             "Keep reading the provider after the caller left; `false`: `finish {aborted}`.",
             ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_DROP_PARAMS", "drop-params", "`false`",
             "`true`: request fields that cannot be translated to the route's dialect are "
             "dropped (listed in `x-tokenwire-dropped-params`) instead of refused with 400; "
             "`TOKENWIRE_<PROVIDER>_DROP_PARAMS` does the same for one provider's routes.",
             ("gateway", *STACK_COMMANDS)),
    Variable("TOKENWIRE_GATEWAY_MAX_STEP_BYTES", "max-step-bytes", "`16777216`",
             "Content bytes of one step; any block up to this is captured, past it a recorded "
             "`limit` error.",
             ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_STEP_CHUNKS", "max-step-chunks", "`100000`",
             "Published chunks of one step; past it a recorded `limit` error.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_STEP_SECONDS", "max-step-seconds", "`600`",
             "Seconds one step may read its provider; past it a recorded `limit` error.",
             ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_STEP_IDLE_SECONDS", "max-step-idle-seconds", "`60`",
             "Seconds one step may go without a chunk; past it a recorded `limit` error.",
             ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_STEP_RETRIES", "step-retries", "`16`",
             "Retries of one step assignment while the step bucket has no leader (a KV leader "
             "election); past them, or past `TOKENWIRE_GATEWAY_STEP_RETRY_S`, the step gets "
             "503 with `retry-after` (0: no retry).", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_STEP_RETRY_S", "step-retry-s", "`30`",
             "Seconds one step assignment may spend on those retries (the caller waits for its "
             "first chunk meanwhile).", ("gateway",)),
    Variable("TOKENWIRE_FRAMES", "frames", "`true`",
             "Publish a step's consecutive chunks in frames, several per broker message "
             "(schema version 2); `false`: one version-1 message per chunk (for a rolling "
             "upgrade: readers first, then frames).", ("gateway", *STACK_COMMANDS)),
    Variable("TOKENWIRE_FRAME_LINGER_MS", "frame-linger-ms", "`200`",
             "How long a frame may wait for more chunks of its step before it is published "
             "(0 to 1000; 0: each provider read's chunks go at once). Never delays the "
             "caller's stream; a step's first chunk and its end go at once.",
             ("gateway", *STACK_COMMANDS)),
    Variable("TOKENWIRE_GATEWAY_COALESCE_MS", "coalesce-ms", "`0`",
             "The default wait in ms before each provider read past a step's first (0 to "
             "1000; 0: none). For agent fleets that act on whole messages: later tokens reach "
             "the caller up to that much later, several per write, for less CPU per token. A "
             "request's `x-tokenwire-coalesce-ms` overrides it; the answer says what was "
             "applied (docs/gateway.md, ADR 0032).", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_RESUMERS", "max-resumers", "`8`",
             "Callers resuming one step at once on a gateway (a retried step, "
             "`GET /v1/responses/{id}`); past it 429 with `retry-after`.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_IDEMPOTENCY_TTL_S", "idempotency-ttl-s", "`86400`",
             "Seconds an `Idempotency-Key` maps to its step; after it the key starts a new "
             "step.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_READERS", "max-readers", "`256`",
             "Session event streams (`GET /v1/sessions/{session}/events`, the viewer) open at "
             "once, each a bounded broker read; past it 503 with `retry-after` (at least 1).",
             ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_HEADER_BYTES", "max-header-bytes", "`65536`",
             "Request line and headers of one request; past it 431.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_HEADERS", "max-headers", "`100`",
             "Headers of one request; past it 431.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_HEADER_TIMEOUT_S", "header-timeout-s", "`10`",
             "First byte to the end of the headers; past it 408.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_BODY_TIMEOUT_S", "body-timeout-s", "`30`",
             "End of the headers to the end of the body; past it 408.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_CONNECTIONS", "max-connections", "`4096`",
             "Open connections at once; past it 503 with `retry-after`.", ("gateway",)),
    Variable("TOKENWIRE_GATEWAY_MAX_REQUESTS", "max-requests", "`2048`",
             "Running requests at once; past it 503 with `retry-after`.", ("gateway",)),
    Variable("TOKENWIRE_ASSEMBLER_METRICS_ADDR", "metrics-addr", "`127.0.0.1:9465`",
             "Assembler metrics and probes; `off` disables.", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_BATCH_STEPS", "batch-steps", "`256`",
             "Commit when this many steps closed ...", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_BATCH_MS", "batch-ms", "`20`",
             "... or when the oldest closed step waited this long.", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_GAP_TIMEOUT_S", "gap-timeout-s", "`30`",
             "Finish seen, chunks missing: close the step as `gap`.", ("assembler", "rebuild")),
    Variable("TOKENWIRE_ASSEMBLER_ABANDON_TIMEOUT_S", "abandon-timeout-s", "`120`",
             "No finish and no chunk for this long: close as `abandoned`.",
             ("assembler", "rebuild")),
    Variable("TOKENWIRE_ASSEMBLER_MAX_OPEN_STEPS", "max-open-steps", "`20000`",
             "Steps held in memory; at the bound the instance stops pulling.", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_ACK_WAIT_S", "ack-wait-s", "`300`",
             "Consumer `ack_wait`: when a dead owner's messages come back.", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_PRIORITY_TIMEOUT_S", "priority-timeout-s", "`5`",
             "A partition's pin moves to a standby after this long without pulls.",
             ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_HEARTBEAT_S", "heartbeat-s", "`1`",
             "Membership heartbeat period (ADR 0016).", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_MEMBER_TTL_S", "member-ttl-s", "`6`",
             "The broker drops a member silent this long (at least two heartbeats and the "
             "priority timeout).", ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_MEMBER", "member", "`<host>-<pid>-<random>`",
             "This instance's member name (shares are assigned in name order).",
             ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_PROVISION", "provision", "`TOKENWIRE_PROVISION`",
             "Create/update the streams and consumers at start; `0`: leave them.",
             ("assembler",)),
    Variable("TOKENWIRE_ASSEMBLER_BURST", "burst", "`0`",
             "`1`: drain what the stream holds, commit, exit.", ("assembler",), switch=True),
    Variable("TOKENWIRE_ASSEMBLER_TUNE_GC", "tune-gc", "`1`",
             "Apply the assembler's GC policy at start; `0`: the interpreter's defaults.",
             ("assembler",)),
    Variable("TOKENWIRE_TELEMETRY_METRICS_ADDR", "metrics-addr", "`127.0.0.1:9466`",
             "Where the telemetry consumer's `/metrics` listens.", ("telemetry",)),
)  # fmt: skip
"""Every row; provider base URLs (``TOKENWIRE_<PROVIDER>_BASE_URL``) and keys
(``<PROVIDER>_API_KEY``) are a family documented with the providers, not flags."""


def for_command(command: str) -> tuple[Variable, ...]:
    """The rows ``command`` takes as flags, in table order."""
    return tuple(v for v in VARIABLES if command in v.commands)


def reference_markdown() -> str:
    """The reference table docs/configuration.md carries between its ``settings`` markers."""
    lines = [
        "| variable | flag | default | commands | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in VARIABLES:
        flag = f"`--{v.flag}`"
        commands = ", ".join(f"`{c}`" for c in v.commands)
        lines.append(f"| `{v.env}` | {flag} | {v.default} | {commands} | {v.meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
