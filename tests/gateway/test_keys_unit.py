"""The keys file, hashing, matching and the session guard, as units (hashlib is the oracle)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenwire.broker import MemorySessionOwners, Owner
from tokenwire.cli._app import cli
from tokenwire.cli._errors import UsageError
from tokenwire.config import ConfigError
from tokenwire.services.gateway import (
    ANONYMOUS,
    Caller,
    GatewaySettings,
    SessionNotFoundError,
    check_bind,
    key_digest,
    may_read,
    parse_keys,
    visible_tenant,
)
from tokenwire.services.gateway._access.keys import (
    KEYS_FILE_VAR,
    KeyRing,
    flat_keys,
    key_ring,
    load_keys_file,
)
from tokenwire.services.gateway._access.owners import SessionGuard

KEY_A, KEY_B, KEY_OPS = "key-a-" + "a" * 40, "key-b-" + "b" * 40, "key-ops-" + "c" * 40


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


FILE = f"""
# a comment
[[keys]]
name = "team-a-ci"
tenant = "team-a"
sha256 = "{sha(KEY_A)}"

[[keys]]
name = "team-b"
sha256 = "{sha(KEY_B).upper()}"

[[keys]]
name = "ops"
scope = "operator"
sha256 = "{sha(KEY_OPS)}"
""".encode()


def test_a_keys_file_gives_each_key_its_caller() -> None:
    ring = KeyRing(parse_keys(FILE))
    assert ring.match(KEY_A) == Caller("team-a-ci", "team-a", operator=False)
    assert ring.match(KEY_B) == Caller("team-b", "team-b", operator=False)  # its own tenant
    assert ring.match(KEY_OPS) == Caller("ops", None, operator=True)
    assert ring.match(KEY_A + " ") is None
    assert ring.match("") is None
    assert ring.tenants


def test_the_digest_is_sha256_of_the_utf8_key() -> None:
    for key in ("abc", "ключ-ü", KEY_A):
        assert key_digest(key) == hashlib.sha256(key.encode("utf-8")).digest()


def test_a_key_is_found_by_its_digest_among_many() -> None:
    # One lookup by SHA-256 (ADR 0041): its timing depends on the offered key's digest only,
    # which no caller can steer toward a configured one.
    many = [
        f'[[keys]]\nname = "k{i}"\nsha256 = "{sha(f"key-{i}-" + "x" * 40)}"\n' for i in range(2000)
    ]
    ring = KeyRing(parse_keys("".join(many).encode()))
    assert len(ring) == 2000
    found = ring.match("key-1234-" + "x" * 40)
    assert found is not None
    assert found.name == "k1234"
    assert ring.match("key-1234-" + "x" * 39) is None


def test_the_flat_list_makes_operators_named_by_their_hash() -> None:
    [named] = flat_keys(["tw-dev-key"])
    assert named.caller == Caller(f"key-{sha('tw-dev-key')[:8]}", None, operator=True)
    assert not KeyRing(flat_keys(["a-key", "b-key"])).tenants


def entry(**fields: str) -> bytes:
    body = "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    return f"[[keys]]\n{body}".encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (entry(name="a", sha256="12ab"), "$.keys[0].sha256: malformed"),
        (entry(name="a b", sha256=sha("x")), "$.keys[0].name: malformed"),
        (entry(name="a", sha256=sha("x"), tenant="t/1"), "$.keys[0].tenant: malformed"),
        (entry(name="a", sha256=sha("x"), scope="admin"), "Invalid enum value 'admin'"),
        (entry(name="a", sha256=sha("x"), key="plain"), "unknown field `key`"),
        (entry(sha256=sha("x")), "missing required field `name`"),
        (entry(name="a", sha256=sha("x")) + entry(name="a", sha256=sha("y")), "name: used twice"),
        (entry(name="a", sha256=sha("x")) + entry(name="b", sha256=sha("x")), "the same key"),
        (b"[[keys]\n", "not a TOML file"),
        (b"[[key]]\nname = 'a'\n", "unknown field `key`"),
    ],
)
def test_a_malformed_keys_file_is_refused_without_echoing_a_hash(data: bytes, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_keys(data, "/etc/keys.toml")
    assert caught.value.name == "TOKENWIRE_GATEWAY_KEYS_FILE"
    assert why in str(caught.value)
    assert sha("x") not in str(caught.value)
    assert sha("x").upper() not in str(caught.value)


def test_an_empty_keys_file_has_no_keys() -> None:
    assert parse_keys(b"") == ()
    assert parse_keys(b"keys = []\n") == ()


def test_a_missing_or_huge_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_keys_file(str(tmp_path / "absent.toml"))
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_keys_file(str(huge))


def test_a_key_or_a_name_in_both_sources_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        key_ring([KEY_A], parse_keys(FILE))
    assert KEY_A not in str(caught.value)
    flat_name = f"key-{sha('tw-flat')[:8]}"
    with pytest.raises(ConfigError, match=flat_name):
        key_ring(["tw-flat"], parse_keys(entry(name=flat_name, sha256=sha("other"))))


def test_settings_read_the_file_and_a_file_alone_allows_any_address(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_bytes(FILE)
    env = {"TOKENWIRE_GATEWAY_KEYS_FILE": str(path), "TOKENWIRE_GATEWAY_ADDR": "0.0.0.0:8080"}
    settings = GatewaySettings.from_env(env)
    assert settings.authenticated
    assert [k.caller.name for k in settings.named_keys] == ["team-a-ci", "team-b", "ops"]
    check_bind(settings)  # keys, so any address
    assert "sha256" not in repr(settings)
    assert "named_keys" not in repr(settings)
    with pytest.raises(ConfigError):
        GatewaySettings.from_env({**env, "TOKENWIRE_GATEWAY_KEYS": KEY_OPS})
    with pytest.raises(ConfigError, match="loopback only"):
        check_bind(GatewaySettings.from_env({"TOKENWIRE_GATEWAY_ADDR": "0.0.0.0:8080"}))


def test_who_may_read_what() -> None:
    a = Caller("k", "team-a", operator=False)
    ops = Caller("ops", None, operator=True)
    assert may_read(a, "team-a")
    assert not may_read(a, "team-b")
    assert not may_read(a, None)
    assert may_read(ops, "team-b")
    assert may_read(ops, None)
    assert may_read(ANONYMOUS, "team-a")
    assert (visible_tenant(a), visible_tenant(ops), visible_tenant(ANONYMOUS)) == (
        "team-a",
        None,
        None,
    )


class CountingOwners(MemorySessionOwners):
    lookups: int = 0

    async def retained(self, session: str) -> Owner | None:
        self.lookups += 1
        return await super().retained(session)


async def test_the_guard_admits_the_owners_tenant_only_and_remembers() -> None:
    owners = CountingOwners(retained_owners={"s-a": Owner("team-a"), "s-none": Owner(None)})
    now = [0.0]
    guard = SessionGuard(owners, active=True, monotonic=lambda: now[0], remembered=2, fresh_s=10)
    a, b = Caller("ka", "team-a", False), Caller("kb", "team-b", False)
    await guard.admit(a, "s-a", named=True)
    await guard.admit(a, "s-a", named=True)
    assert owners.lookups == 1  # remembered
    with pytest.raises(SessionNotFoundError):
        await guard.admit(b, "s-a", named=True)
    with pytest.raises(SessionNotFoundError):
        await guard.admit(Caller("ops", None, True), "s-a", named=True)  # operators too
    with pytest.raises(SessionNotFoundError):
        await guard.admit(a, "s-none", named=True)
    await guard.admit(b, "s-new", named=True)  # no retained step: B's record
    assert owners.records == {"s-new": Owner("team-b")}
    with pytest.raises(SessionNotFoundError):
        await guard.admit(a, "s-new", named=True)
    await guard.admit(a, "made-by-gateway", named=False)  # a new id: nothing asked
    assert "made-by-gateway" not in owners.records
    before = owners.lookups
    now[0] = 11.0  # past fresh_s: asked again
    await guard.admit(b, "s-new", named=True)
    assert owners.lookups == before + 1


async def test_an_inactive_guard_asks_nothing() -> None:
    owners = CountingOwners(retained_owners={"s": Owner("team-a")})
    guard = SessionGuard(owners, active=False)
    await guard.admit(Caller("k", "team-b", False), "s", named=True)
    assert owners.lookups == 0


def run_cli(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tokenwire", *args]
    return subprocess.run(
        command, check=False, input=stdin, capture_output=True, text=True, timeout=60
    )


def test_keys_hash_prints_what_sha256sum_prints_and_a_loadable_entry() -> None:
    key = "tw-" + "9" * 40
    done = run_cli("keys", "hash", stdin=key + "\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, sha(key) + "\n", "")
    done = run_cli("keys", "hash", "--name", "ci", "--tenant", "team-a", stdin=key)
    assert done.returncode == 0, done.stderr
    assert KeyRing(parse_keys(done.stdout.encode())).match(key) == Caller("ci", "team-a", False)
    assert key not in done.stdout


def test_keys_hash_warns_of_short_keys_and_refuses_bad_input() -> None:
    runner = CliRunner()
    short = runner.invoke(cli, ["keys", "hash"], input="abc\n")
    assert short.exit_code == 0
    assert short.stdout == sha("abc") + "\n"
    assert "can be guessed" in short.stderr
    for args, stdin in (
        (["keys", "hash"], ""),
        (["keys", "hash", "--name", 'x"y'], "k" * 40),
        (["keys", "hash", "--operator"], "k" * 40),
    ):
        refused = runner.invoke(cli, args, input=stdin)
        assert isinstance(refused.exception, UsageError), args


def test_the_ring_summarises_its_keys_by_name_never_by_key_or_hash() -> None:
    ring = key_ring({KEY_OPS + "-flat"}, parse_keys(FILE))
    line = ring.summary()
    assert line.startswith("4 gateway keys (with tenants): ")
    assert "team-a-ci, team-b, ops" in line
    flat = "key-" + sha(KEY_OPS + "-flat")[:8]
    assert flat in line  # a flat key's name: what its steps are recorded under
    for secret in (KEY_A, KEY_B, KEY_OPS, sha(KEY_A), sha(KEY_B), sha(KEY_OPS)):
        assert secret not in line
    assert KeyRing(()).summary().startswith("no gateway keys: loopback only")


async def test_reread_keys_reads_the_file_again_and_use_keys_swaps_them(tmp_path: Path) -> None:
    """What SIGHUP does (the real signal: test_keys_reload_real.py): the file read again,
    the flat list kept, a key removed from the file refused from the next request on."""
    from tests.gateway._helpers import make_rig, recording

    path = tmp_path / "keys.toml"
    ops = f'[[keys]]\nname = "ops"\nscope = "operator"\nsha256 = "{sha(KEY_OPS)}"\n'
    ci = f'[[keys]]\nname = "ci"\nscope = "operator"\nsha256 = "{sha(KEY_A)}"\n'
    path.write_text(ops + ci)
    settings = GatewaySettings.from_env({KEYS_FILE_VAR: str(path)})
    rig = make_rig(
        recording("openai/chat-text-include-usage.sse"),
        keys=frozenset(),
        named_keys=settings.named_keys,
        keys_file=str(path),
    )
    gateway = rig.app.state.gateway
    ok = {"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    async with rig.client(authorization=f"Bearer {KEY_OPS}") as client:
        assert (await client.post("/v1/chat/completions", json=ok)).status_code == 200
        path.write_text(ci)  # ops removed
        gateway.use_keys(rig.settings.reread_keys())
        assert (await client.post("/v1/chat/completions", json=ok)).status_code == 401
    path.write_text("not toml [[")
    with pytest.raises(ConfigError, match=r"keys\.toml"):
        rig.settings.reread_keys()
    assert gateway.keys.names() == ["ci"]  # a bad file changed nothing
    path.write_text("")
    with pytest.raises(ConfigError, match="must have keys"):
        replace(rig.settings, host="0.0.0.0").reread_keys()


def test_a_keys_file_gives_each_caller_its_own_and_its_tenants_limits() -> None:
    digest = hashlib.sha256(b"k1").hexdigest()
    data = f"""
[[keys]]
name = "agent"
sha256 = "{digest}"
tenant = "acme"
limits = {{ rpm = 60, budget = {{ usd = "0.05", period = "month" }} }}

[[tenants]]
name = "acme"
limits = {{ tpm = 1000, concurrent = 3 }}
""".encode()
    (key,) = parse_keys(data)
    assert (key.caller.limits.rpm, key.caller.limits.tpm) == (60, None)
    assert key.caller.limits.budget is not None
    assert (key.caller.limits.budget.usd, key.caller.limits.budget.period) == ("0.05", "month")
    assert (key.caller.tenant_limits.tpm, key.caller.tenant_limits.concurrent) == (1000, 3)


def test_a_limit_below_one_is_refused_with_its_place() -> None:
    digest = hashlib.sha256(b"k1").hexdigest()
    data = f'[[keys]]\nname = "a"\nsha256 = "{digest}"\nlimits = {{ rpm = 0 }}\n'.encode()
    with pytest.raises(ConfigError, match=r"\$\.keys\[0\]\.limits\.rpm"):
        parse_keys(data)
