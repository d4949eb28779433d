"""``tokenwire keys``: gateway keys in the broker's keys bucket, and their hashes.

``create``, ``list``, ``revoke``, ``set`` and ``set-tenant`` change the keys bucket every
gateway watches (``_keys_bucket.py``; ADR 0041). ``hash`` prints the SHA-256 a keys file holds
for a key read from stdin (its one trailing line break dropped), or asked for without echo on
a terminal, never from the command line (``ps`` shows arguments to every local user): the
hash is ``sha256(key as UTF-8)`` in hex, what ``printf %s "$KEY" | sha256sum`` prints; with
``--name`` the output is a whole ``[[keys]]`` entry, checked by the gateway's own parser.
"""

from __future__ import annotations

import sys

import click
import msgspec

from tokenwire.cli._errors import UsageError
from tokenwire.config import ConfigError
from tokenwire.services.gateway import key_digest, parse_keys

SHORT_KEY = 32
"""Below this many characters a key is guessable from its hash: a warning says so."""


@click.group()
def keys() -> None:
    """Gateway keys: the broker's keys bucket, and the keys file's hashes (docs/gateway.md)."""


def _register_bucket_commands() -> None:
    from tokenwire.cli._keys_bucket import BUCKET_COMMANDS

    for command in BUCKET_COMMANDS:
        keys.add_command(command)


@keys.command("hash")
@click.option("--name", help="Print a whole [[keys]] entry with this name.")
@click.option("--tenant", help="The entry's tenant (default: its name, for a tenant key).")
@click.option("--operator", is_flag=True, help="The entry reads every tenant's sessions.")
def hash_key(name: str | None, tenant: str | None, operator: bool) -> None:
    """Print the SHA-256 of a key read from stdin (or asked for on a terminal)."""
    if (tenant or operator) and name is None:
        raise UsageError("--tenant and --operator need --name (they describe an entry)")
    key = _read_key()
    if len(key) < SHORT_KEY:
        click.echo(
            f"tokenwire: warning: a key of {len(key)} characters can be guessed from "
            "its hash; make one with `openssl rand -hex 32`",
            err=True,
        )
    digest = key_digest(key).hex()
    if name is None:
        click.echo(digest)
        return
    click.echo(_entry(name, tenant, operator, digest), nl=False)


def _read_key() -> str:
    if sys.stdin.isatty():
        key = str(click.prompt("key", hide_input=True, err=True))
    else:
        key = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not key:
        raise UsageError("no key on stdin")
    return key


def _quoted(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's): nothing typed can end it early."""
    return msgspec.json.encode(text).decode()


def _entry(name: str, tenant: str | None, operator: bool, digest: str) -> str:
    lines = ["[[keys]]", f"name = {_quoted(name)}"]
    if tenant is not None:
        lines.append(f"tenant = {_quoted(tenant)}")
    if operator:
        lines.append('scope = "operator"')
    lines.append(f'sha256 = "{digest}"')
    text = "\n".join(lines) + "\n"
    try:
        parse_keys(text.encode(), "--name/--tenant")
    except ConfigError as exc:
        raise UsageError(exc.why) from None
    return text


_register_bucket_commands()
