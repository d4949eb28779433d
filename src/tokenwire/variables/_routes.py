"""The gateway's routes file rows (docs/gateway.md, "Routes"), re-exported by the catalogue,
which lists them in ``VARIABLES`` with the gateway's own."""

from __future__ import annotations

from tokenwire.variables._parse import integer, parse_seconds, text
from tokenwire.variables._variable import Variable

ROUTES_FILE: Variable[str] = Variable(
    env="TOKENWIRE_ROUTES_FILE",
    flag="routes-file",
    parse=text,
    default="",
    meaning=(
        "TOML file of public model names, each a group of deployments (provider, model, base "
        "URL, the NAME of the variable holding its key, weight, rpm/tpm, price) with "
        'fallbacks (docs/gateway.md, "Routes"). Checked at start (exit 2 naming the entry), '
        "reloaded when it changes. Absent: only `provider/model`."
    ),
    commands=("gateway", "up"),
)
ROUTES_RELOAD_S: Variable[float] = Variable(
    env="TOKENWIRE_ROUTES_RELOAD_S",
    flag="routes-reload-s",
    parse=parse_seconds,
    default="2",
    meaning=(
        "How often the routes file's modification time is checked; a changed file that checks "
        "replaces the routes in force, one that does not is logged and counted and the old "
        "routes stay."
    ),
    commands=("gateway", "up"),
)
ROUTES_MAX_ATTEMPTS: Variable[int] = Variable(
    env="TOKENWIRE_ROUTES_MAX_ATTEMPTS",
    flag="routes-max-attempts",
    parse=integer(1, 16),
    default="4",
    meaning=(
        "Provider calls one routed step may make before its first byte (the first and its "
        "fallbacks, 1 to 16); past it the last failure is the answer."
    ),
    commands=("gateway", "up"),
)
ROUTES_MAX_WAIT_S: Variable[float] = Variable(
    env="TOKENWIRE_ROUTES_MAX_WAIT_S",
    flag="routes-max-wait-s",
    parse=parse_seconds,
    default="60",
    meaning=(
        "Seconds after a routed step's first call within which a fallback may still start "
        "(each call's first token is bounded by its model's `first_byte_timeout_s`)."
    ),
    commands=("gateway", "up"),
)
