"""Keys that live in the broker, as units over the keys bucket's twin (``broker.MemoryKeys``):
the ring's precedence (flat list, then the bucket over the keys file), seeding, a reloaded
file's edits, a revoke applied without a restart, the last ring kept (and ``/readyz`` saying
so) while the bucket does not answer, expiry and model allowlists answered in the caller's
dialect, and the operator keys API. hashlib is the oracle of every digest."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tokenwire.broker import BrokerUnavailable, KeyEntry, MemoryKeys, MemorySessionOwners
from tokenwire.schemas import KeyRecord, Limits, TenantRecord
from tokenwire.services.gateway import Caller, Gateway
from tokenwire.services.gateway._access.keys import flat_keys, named_key
from tokenwire.services.gateway._access.live_keys import Bootstrap, LiveKeys, merged_ring

KEY_A, KEY_B, KEY_OPS = "tw-a-" + "a" * 40, "tw-b-" + "b" * 40, "tw-ops-" + "c" * 40
USER = [{"role": "user", "content": "hi"}]
NONE = {"rpm": None, "tpm": None, "concurrent": None, "budget": None}
TEXT = recording("openai/chat-text-include-usage.sse")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def record(name: str, key: str, **fields: Any) -> KeyRecord:
    return KeyRecord(name=name, sha256=sha(key), **fields)


def entry(rec: KeyRecord | TenantRecord | None, name: str, revision: int = 1) -> KeyEntry:
    if isinstance(rec, TenantRecord):
        return KeyEntry("tenant", name, revision, rec)
    return KeyEntry("key", name, revision, rec)


def names(ring: Any) -> list[str]:
    return sorted(ring.names())


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for ``check``: the rebuild runs on the loop's next turn."""
    async with asyncio.timeout(5):
        for _ in range(100_000):
            if check():
                return
            await asyncio.sleep(0.001)
    raise AssertionError(what)


def test_the_bucket_wins_over_the_file_and_never_over_the_flat_list() -> None:
    filed = (named_key(record("a", KEY_A, tenant="t"), {}), named_key(record("b", KEY_B), {}))
    flat = flat_keys([KEY_OPS])
    boot = Bootstrap(flat=flat, filed=filed, tenants={"t": Limits(rpm=5)})
    entries = {
        ("key", "a"): entry(record("a", KEY_A, tenant="t", limits=Limits(rpm=60)), "a"),
        ("key", "b"): entry(None, "b"),  # revoked
        ("key", "c"): entry(record("c", KEY_B, tenant="t"), "c"),
        ("key", "ops"): entry(record("ops", KEY_OPS, scope="operator"), "ops"),  # flat's key
        ("tenant", "t"): entry(TenantRecord(name="t", limits=Limits(tpm=100)), "t"),
    }
    ring, problems = merged_ring(boot, entries, keyed=True)
    assert names(ring) == sorted(["a", "c", flat[0].caller.name or ""])
    a = ring.match(KEY_A)
    assert a == Caller(
        "a", "t", operator=False, limits=Limits(rpm=60), tenant_limits=Limits(tpm=100)
    )
    assert ring.match(KEY_B) == Caller("c", "t", operator=False, tenant_limits=Limits(tpm=100))
    assert ring.match(KEY_OPS) == flat[0].caller
    assert problems == ["key ops: its name or key is taken: left out"]


def test_without_bucket_entries_the_file_holds_with_its_tenants() -> None:
    filed = (named_key(record("a", KEY_A, tenant="t"), {"t": Limits(rpm=5)}),)
    ring, _ = merged_ring(Bootstrap(filed=filed, tenants={"t": Limits(rpm=5)}), {}, keyed=False)
    caller = ring.match(KEY_A)
    assert caller is not None
    assert caller.tenant_limits == Limits(rpm=5)


def test_an_unreadable_entry_or_expiry_refuses_that_key_alone() -> None:
    entries = {
        ("key", "a"): KeyEntry("key", "a", 1, None, invalid="expected an object"),
        ("key", "b"): entry(record("b", KEY_B, expires_at="tomorrow"), "b"),
        ("key", "c"): entry(record("c", KEY_OPS), "c"),
    }
    filed = (named_key(record("a", KEY_A), {}),)
    ring, problems = merged_ring(Bootstrap(filed=filed), entries, keyed=True)
    assert names(ring) == ["c"]
    assert len(problems) == 2


class Applied:
    def __init__(self) -> None:
        self.rings: list[Any] = []

    def __call__(self, ring: Any) -> None:
        self.rings.append(ring)

    @property
    def last(self) -> Any:
        return self.rings[-1]


async def test_the_file_seeds_the_bucket_and_a_revoke_applies_without_a_restart() -> None:
    book = MemoryKeys()
    seeds = (TenantRecord(name="t", limits=Limits(rpm=9)), record("a", KEY_A, tenant="t"))
    filed = (named_key(record("a", KEY_A, tenant="t"), {}),)
    applied = Applied()
    live = LiveKeys(Bootstrap(filed=filed, seeds=seeds), book, apply=applied, keyed=True)
    await live.start()
    try:
        assert live.stale() is None
        held = await book.entry("key", "a")
        assert held is not None
        assert held.record == seeds[1]
        await until(
            lambda: applied.last.match(KEY_A).tenant_limits == Limits(rpm=9), "a, its tenant's"
        )
        await book.write("key", "a", None, expected=held.revision)
        await until(lambda: applied.last.match(KEY_A) is None, "a refused after its revoke")
        assert bool(applied.last)  # still keyed: no key left is no key accepted
        # a gateway started later does not seed the revoked name again
        again = Applied()
        later = LiveKeys(Bootstrap(filed=filed, seeds=seeds), book, apply=again, keyed=True)
        await later.start()
        await later.stop()
        assert again.last.match(KEY_A) is None
        gone = await book.entry("key", "a")
        assert gone is not None
        assert gone.record is None
    finally:
        await live.stop()


@contextlib.asynccontextmanager
async def checking_with_b(book: MemoryKeys) -> AsyncIterator[tuple[LiveKeys, Applied]]:
    """A gateway's live keys over ``book`` (checked every 10 ms), once key b is accepted."""
    await book.write("key", "b", record("b", KEY_B), expected=0)
    applied = Applied()
    live = LiveKeys(Bootstrap(), book, apply=applied, keyed=True, check_s=0.01)
    await live.start()
    try:
        await until(lambda: applied.last.match(KEY_B) is not None, "b accepted")
        yield live, applied
    finally:
        await live.stop()


async def test_a_bucket_that_does_not_answer_keeps_the_last_ring_and_says_so() -> None:
    book = MemoryKeys()
    async with checking_with_b(book) as (live, applied):
        book.down = True
        await until(lambda: live.stale() is not None, "stale said")
        assert "did not answer" in (live.stale() or "")
        assert applied.last.match(KEY_B) is not None  # the last ring stays
        book.down = False
        await book.write("key", "a", record("a", KEY_A), expected=0)
        await until(lambda: live.stale() is None, "fresh again")
        await until(lambda: applied.last.match(KEY_A) is not None, "a accepted after")


class BuggyKeys(MemoryKeys):
    """A bucket twin whose reads fail with an error no check expects while ``buggy``."""

    buggy = False

    async def last_revision(self) -> int:
        if self.buggy:
            raise RuntimeError("a bug in a check")
        return await super().last_revision()


async def test_a_check_that_fails_unexpectedly_says_stale_and_the_checks_go_on() -> None:
    """Ended by the error, the checks would stop: a revoke would never apply."""
    book = BuggyKeys()
    async with checking_with_b(book) as (live, applied):
        book.buggy = True
        await until(lambda: live.stale() is not None, "stale said")
        assert live.stale() == "the check failed (RuntimeError)"  # /readyz: the kind, no text
        book.buggy = False
        held = await book.entry("key", "b")
        assert held is not None
        await book.write("key", "b", None, expected=held.revision)
        await until(lambda: applied.last.match(KEY_B) is None, "b refused after its revoke")
        await until(lambda: live.stale() is None, "fresh again")


class ReadOnlyKeys(MemoryKeys):
    """A bucket this gateway may read but not write (an older deploy's permissions)."""

    refused = 0

    async def write(self, *args: Any, **kwargs: Any) -> int | None:
        self.refused += 1
        raise BrokerUnavailable("memory://keys (write refused)")


async def test_a_bucket_that_refuses_the_seeds_is_not_stale_and_the_file_keys_hold() -> None:
    book = ReadOnlyKeys()
    a = record("a", KEY_A)
    applied = Applied()
    boot = Bootstrap(filed=(named_key(a, {}),), seeds=(a,))
    live = LiveKeys(boot, book, apply=applied, keyed=True, check_s=0.01)
    await live.start()
    try:
        await until(lambda: book.refused >= 3, "the seed tried at three checks")
        assert live.stale() is None
        assert applied.last.match(KEY_A) is not None
    finally:
        await live.stop()


async def test_a_reloaded_file_revokes_what_it_removed_unless_changed_since() -> None:
    book = MemoryKeys()
    a, b = record("a", KEY_A), record("b", KEY_B)
    applied = Applied()
    boot = Bootstrap(filed=(named_key(a, {}), named_key(b, {})), seeds=(a, b))
    live = LiveKeys(boot, book, apply=applied, keyed=True, check_s=0.01)
    await live.start()
    try:
        held_b = await book.entry("key", "b")
        assert held_b is not None
        changed_b = record("b", KEY_B, limits=Limits(rpm=1))  # changed by the CLI since
        await book.write("key", "b", changed_b, expected=held_b.revision)
        live.reboot(Bootstrap(filed=(), seeds=()))
        await until(lambda: applied.last.match(KEY_A) is None, "a revoked")
        held_a = await book.entry("key", "a")
        assert held_a is not None
        assert held_a.record is None
        kept = await book.entry("key", "b")
        assert kept is not None
        assert kept.record == changed_b
        assert applied.last.match(KEY_B) is not None
    finally:
        await live.stop()


# -- the gateway ----------------------------------------------------------------------------


async def started(book: MemoryKeys, **settings: Any) -> tuple[Any, Gateway]:
    rig = make_rig(TEXT, key_book=book, owners=MemorySessionOwners(), **settings)
    gw: Gateway = rig.app.state.gateway
    await gw.live_keys.start()
    return rig, gw


async def chat(rig: Any, key: str, model: str = "openai/gpt-4o") -> httpx.Response:
    async with rig.client(authorization=f"Bearer {key}") as client:
        body = {"model": model, "messages": USER, "stream": True}
        response: httpx.Response = await client.post("/v1/chat/completions", json=body)
        return response


async def test_an_expired_key_is_refused_in_the_callers_dialect() -> None:
    book = MemoryKeys()
    past = "2020-01-01T00:00:00Z"
    await book.write("key", "old", record("old", KEY_A, expires_at=past), expected=0)
    await book.write("key", "new", record("new", KEY_B, expires_at="2999-01-01T00:00Z"), expected=0)
    rig, gw = await started(book)
    try:
        refused = await chat(rig, KEY_A)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert "expired" in refused.json()["error"]["message"]
        async with rig.client(**{"x-api-key": KEY_A}) as client:
            body = {"model": "anthropic/claude", "max_tokens": 9, "messages": USER}
            anthropic = await client.post("/v1/messages", json=body)
        assert anthropic.status_code == 401
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "authentication_error"
        assert (await chat(rig, KEY_B)).status_code == 200
    finally:
        await gw.live_keys.stop()


async def test_a_model_outside_the_allowlist_is_a_403_naming_it() -> None:
    book = MemoryKeys()
    allowed = record("narrow", KEY_A, models=["openai/gpt-4o-mini", "scripted/*"])
    await book.write("key", "narrow", allowed, expected=0)
    rig, gw = await started(book)
    try:
        refused = await chat(rig, KEY_A, "openai/gpt-4o")
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "model_not_allowed"  # the SDK: PermissionDeniedError (403)
        assert error["param"] == "model"
        assert "'openai/gpt-4o'" in error["message"]
        assert "narrow" in error["message"]
        assert not rig.upstream.requests  # the refused call reached no provider
        async with rig.client(**{"x-api-key": KEY_A}) as client:
            body = {"model": "anthropic/claude", "max_tokens": 9, "messages": USER}
            anthropic = await client.post("/v1/messages", json=body)
        assert anthropic.status_code == 403
        assert anthropic.json()["error"]["type"] == "permission_error"
        assert (await chat(rig, KEY_A, "openai/gpt-4o-mini")).status_code == 200
        assert (await chat(rig, KEY_A, "scripted/any")).status_code == 200
    finally:
        await gw.live_keys.stop()


async def test_the_operator_api_creates_changes_and_revokes_keys_live() -> None:
    book = MemoryKeys()
    await book.write("key", "ops", record("ops", KEY_OPS, scope="operator"), expected=0)
    await book.write("key", "tenant", record("tenant", KEY_B), expected=0)
    rig, gw = await started(book)
    try:
        async with rig.client(authorization=f"Bearer {KEY_B}") as client:
            denied = await client.get("/v1/keys")
        assert denied.status_code == 403
        async with rig.client(authorization=f"Bearer {KEY_OPS}") as client:
            made = await client.post("/v1/keys", json={"name": "ci", "limits": {"rpm": 60}})
            assert made.status_code == 201
            key = made.json()["key"]
            assert made.json()["record"]["sha256_prefix"] == sha(key)[:8]
            await until(lambda: gw.keys.match(key) is not None, "the new key accepted")
            assert (await chat(rig, key)).status_code == 200
            twice = await client.post("/v1/keys", json={"name": "ci"})
            assert twice.status_code == 409
            patched = await client.patch("/v1/keys/ci", json={"limits": {"tpm": 1000}})
            assert patched.json()["limits"] == {**NONE, "rpm": 60, "tpm": 1000}
            await until(lambda: _limits(gw, key).tpm == 1000, "the change applied")
            tenant = await client.patch("/v1/tenants/ci", json={"concurrent": 3})
            assert tenant.json() == {"name": "ci", "limits": {**NONE, "concurrent": 3}}
            await until(lambda: _limits(gw, key, tenant=True) == Limits(concurrent=3), "tenant")
            listed = (await client.get("/v1/keys")).json()
            assert [k["name"] for k in listed["keys"]] == ["ci", "ops", "tenant"]
            assert all("sha256" not in k for k in listed["keys"])
            assert (await client.delete("/v1/keys/ci")).status_code == 200
            await until(lambda: gw.keys.match(key) is None, "the revoke applied")
            assert (await chat(rig, key)).status_code == 401
            assert (await client.delete("/v1/keys/ci")).status_code == 404
            bad = await client.post("/v1/keys", json={"name": "x", "expires_at": "soon"})
            assert bad.status_code == 400
    finally:
        await gw.live_keys.stop()


def _limits(gw: Gateway, key: str, *, tenant: bool = False) -> Limits:
    caller = gw.keys.match(key)
    assert caller is not None
    return caller.tenant_limits if tenant else caller.limits


async def test_readyz_says_keys_stale_while_the_bucket_does_not_answer() -> None:
    book = MemoryKeys()
    rig, gw = await started(book, keys=frozenset({GATEWAY_KEY}))
    try:
        async with rig.client() as client:
            assert (await client.get("/readyz")).status_code == 200
            book.down = True
            await until(lambda: gw.live_keys.stale() is not None, "stale")
            ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["reasons"] == ["keys-stale"]
        assert (await chat(rig, GATEWAY_KEY)).status_code == 200  # the flat key still works
    finally:
        await gw.live_keys.stop()


class LeakyKeys(MemoryKeys):
    """A bucket twin whose check fails with text an outsider must not read: a broker's
    internal address, or (a bug's error) a key's name, as ``fails`` says."""

    fails: Exception | None = None

    async def last_revision(self) -> int:
        if self.fails is not None:
            raise self.fails
        return await super().last_revision()


@pytest.mark.parametrize(
    "fails",
    [
        BrokerUnavailable("nats://broker-SENTINEL.internal:4222", "keys last revision"),
        RuntimeError("no tenant for the key 'acme-SENTINEL-ops'"),
    ],
)
async def test_readyz_says_keys_stale_without_the_errors_text(
    fails: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """``/readyz`` answers anyone: why the keys are stale, never where the broker is."""
    book = LeakyKeys()
    rig, gw = await started(book, keys=frozenset({GATEWAY_KEY}))
    try:
        book.fails = fails
        await until(lambda: gw.live_keys.stale() is not None, "stale")
        async with rig.client() as client:
            ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["reasons"] == ["keys-stale"]
        assert type(fails).__name__ in ready.text
        assert "SENTINEL" not in ready.text
        assert "SENTINEL" in caplog.text  # the operator's log has it whole
    finally:
        await gw.live_keys.stop()


@pytest.mark.parametrize("key", [KEY_A, GATEWAY_KEY])
async def test_a_gateway_without_a_bucket_keeps_the_file_and_flat_keys(key: str) -> None:
    filed = (named_key(record("a", KEY_A, scope="operator"), {}),)
    rig = make_rig(TEXT, named_keys=filed)
    gw: Gateway = rig.app.state.gateway
    await gw.live_keys.start()
    assert gw.live_keys.stale() is None
    assert (await chat(rig, key)).status_code == 200
    assert (await chat(rig, KEY_B)).status_code == 401
