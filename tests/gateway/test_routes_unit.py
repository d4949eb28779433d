"""The routes file, balancing and the deployments' health, one piece at a time (no sockets):
the file's checks name the entry, the weighted choice follows the weights (a binomial bound
with a fixed, printed seed), least-in-flight picks the idle one, and the health book cools a
deployment down, skips it and lets exactly one request probe it once the cooldown ended."""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tokenwire.broker import (
    Cooling,
    Healthy,
    MemoryCooldowns,
    ProbeClaim,
    ProbeDue,
    Probing,
    RequestFailed,
)
from tokenwire.providers import Dialect
from tokenwire.schemas import AttemptFailure, FailedAttempt
from tokenwire.services.gateway._errors import RouteUnavailableError
from tokenwire.services.gateway._routing.health import HealthBook
from tokenwire.services.gateway._routing.plan import AttemptBounds, RoutePlan, plan_route
from tokenwire.services.gateway._routing.routes_file import (
    DeploymentSpec,
    HealthPolicy,
    RoutesFileError,
    load_routes,
    parse_routes,
)
from tokenwire.services.gateway._routing.table import RouteTable

SEED = 20261207
ROUTES = b"""
[defaults]
failures = 2
window_s = 30
cooldown_s = 10

[[models]]
name = "gpt-4o"
fallbacks = ["claude"]
  [[models.deployments]]
  name = "east"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://127.0.0.1:9/v1"
  weight = 3
  [[models.deployments]]
  name = "west"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://127.0.0.1:10/v1"
  weight = 1

[[models]]
name = "claude"
  [[models.deployments]]
  name = "anthropic-main"
  provider = "anthropic"
  model = "claude-sonnet-4-5"
  api_key_env = "CLAUDE_KEY"

[[models]]
name = "three"
strategy = "weighted"
  [[models.deployments]]
  name = "a"
  provider = "vllm"
  model = "m"
  weight = 1
  [[models.deployments]]
  name = "b"
  provider = "vllm"
  model = "m"
  weight = 2
  [[models.deployments]]
  name = "c"
  provider = "vllm"
  model = "m"
  weight = 5

[[models]]
name = "idle-first"
strategy = "least-in-flight"
  [[models.deployments]]
  name = "busy"
  provider = "vllm"
  model = "m"
  weight = 100
  [[models.deployments]]
  name = "idle"
  provider = "vllm"
  model = "m"
  weight = 1
"""
ENV = {"CLAUDE_KEY": "sk-ant-test"}


def _table() -> RouteTable:
    return RouteTable(parse_routes(ROUTES, ENV, "routes.toml"), ENV)


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def ns(self) -> int:
        return int(self.s * 1e9)

    def mono(self) -> float:
        return self.s


def _plan(
    table: RouteTable, health: HealthBook, name: str, rng: random.Random, clock: Clock
) -> RoutePlan | None:
    return plan_route(
        table,
        name,
        Dialect.OPENAI_CHAT,
        health,
        rng=rng,
        bounds=AttemptBounds(),
        monotonic=clock.mono,
    )


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ((b"weight = 3", b"weight = 0"), "$.models[0].deployments[0].weight"),
        ((b'"claude"]', b'"nobody"]'), "$.models[0].fallbacks[0]"),
        ((b'name = "west"', b'name = "east"'), "$.models[0].deployments[1].name"),
        (
            (b'api_key_env = "CLAUDE_KEY"', b'api_key_env = "UNSET_KEY"'),
            "$.models[1].deployments[0].api_key_env",
        ),
        (
            (b'provider = "anthropic"', b'provider = "anthropics"'),
            "$.models[1].deployments[0].provider",
        ),
        ((b'name = "claude"\n', b'name = "gpt-4o"\n'), "$.models[1].name"),
        (
            (b'base_url = "http://127.0.0.1:9/v1"', b'base_url = "ftp://x"'),
            "$.models[0].deployments[0].base_url",
        ),
        ((b"cooldown_s = 10", b"cooldown_s = 10\ncooldwn = 1"), "$.defaults"),
    ],
)
def test_a_bad_entry_is_named(change: tuple[bytes, bytes], where: str) -> None:
    bad = ROUTES.replace(*change, 1)
    assert bad != ROUTES
    with pytest.raises(RoutesFileError) as caught:
        parse_routes(bad, ENV, "routes.toml")
    assert caught.value.name == "TOKENWIRE_ROUTES_FILE"
    assert where in str(caught.value)
    assert "sk-ant-test" not in str(caught.value)


def test_mixed_dialects_in_one_model_are_refused() -> None:
    bad = ROUTES.replace(
        b'name = "west"\n  provider = "openai"', b'name = "west"\n  provider = "anthropic"'
    )
    with pytest.raises(RoutesFileError, match=r"\$\.models\[0\]\.deployments: one model's"):
        parse_routes(bad, ENV, "routes.toml")


def _binomial_bound(n: int, p: float) -> float:
    """Four and a half standard deviations of a binomial count: a false alarm about once in
    300,000 runs if the choice follows the weights."""
    return 4.5 * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize(
    ("name", "weights"), [("gpt-4o", {"east": 3, "west": 1}), ("three", {"a": 1, "b": 2, "c": 5})]
)
async def test_the_first_pick_follows_the_weights(name: str, weights: dict[str, int]) -> None:
    print(f"seed {SEED}")
    table, clock, rng = _table(), Clock(), random.Random(SEED)
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    n = 20_000
    counts = dict.fromkeys(weights, 0)
    for _ in range(n):
        plan = _plan(table, health, name, rng, clock)
        assert plan is not None
        first = await plan.next()
        assert first is not None
        counts[first.spec.name] += 1
        health.done(first.spec)
    total = sum(weights.values())
    for deployment, weight in weights.items():
        p = weight / total
        assert abs(counts[deployment] - n * p) <= _binomial_bound(n, p), (counts, deployment)


async def test_the_fallback_comes_after_every_deployment_of_the_group() -> None:
    table, clock = _table(), Clock()
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    plan = _plan(table, health, "gpt-4o", random.Random(SEED), clock)
    assert plan is not None
    names = []
    while (candidate := await plan.next()) is not None:
        names.append(candidate.spec.name)
    assert sorted(names[:2]) == ["east", "west"]
    assert names[2:] == ["anthropic-main"]


async def test_least_in_flight_picks_the_idle_deployment_whatever_the_weights() -> None:
    table, clock = _table(), Clock()
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    group = table.group("idle-first")
    assert group is not None
    busy = group.deployments[0].spec
    health.sent(busy)
    for _ in range(50):
        plan = _plan(table, health, "idle-first", random.Random(), clock)
        assert plan is not None
        first = await plan.next()
        assert first is not None
        assert first.spec.name == "idle"
        health.done(first.spec)


def _attempt(
    name: str, failure: AttemptFailure, retry_after_s: float | None = None
) -> FailedAttempt:
    return FailedAttempt(
        deployment=name,
        provider="openai",
        model="gpt-4o",
        failure=failure,
        status=429 if retry_after_s else None,
        retry_after_s=retry_after_s,
    )


async def test_a_429_with_retry_after_cools_every_gateway_and_one_probe_follows() -> None:
    table, clock, board = _table(), Clock(), MemoryCooldowns()
    group = table.group("gpt-4o")
    assert group is not None
    east, west = (d.spec for d in group.deployments)
    policy = group.spec.health
    books = [HealthBook(board, clock_ns=clock.ns, monotonic=clock.mono) for _ in range(3)]
    for book in books:
        await book.start()
    books[0].failed(east, policy, _attempt("east", "rate-limited", retry_after_s=30))
    await _settled(books[0])
    board_state = await board.state("east")
    assert isinstance(board_state, Cooling)
    for book in books:
        assert book.availability(east) == "cooling"
        assert book.availability(west) == "ok"
    # every gateway's plans skip it while it cools down
    plan = _plan(table, books[1], "gpt-4o", random.Random(SEED), clock)
    assert plan is not None
    picked = [c.spec.name for c in [await plan.next(), await plan.next()] if c is not None]
    assert picked == ["west", "anthropic-main"]
    # the cooldown ends: exactly one of the gateways wins the probe
    board.expire("east")
    assert all(book.availability(east) == "probe" for book in books)
    won = [await book.claim_probe(east, policy) for book in books]
    assert won.count(True) == 1
    prober = books[won.index(True)]
    others = [b for b in books if b is not prober]
    assert all(b.availability(east) == "probing" for b in others)
    prober.answered(east)
    await _settled(prober)
    assert isinstance(await board.state("east"), Healthy)
    assert all(book.availability(east) == "ok" for book in books)


async def test_failures_within_the_window_cool_a_deployment_and_a_failed_probe_again() -> None:
    table, clock, board = _table(), Clock(), MemoryCooldowns()
    group = table.group("gpt-4o")
    assert group is not None
    east = group.deployments[0].spec
    policy = group.spec.health  # 2 failures within 30 s, 10 s cooldown
    book = HealthBook(board, clock_ns=clock.ns, monotonic=clock.mono)
    await book.start()
    book.failed(east, policy, _attempt("east", "server-error"))
    clock.s += 31  # out of the window
    book.failed(east, policy, _attempt("east", "connect"))
    assert book.availability(east) == "ok"
    clock.s += 1
    book.failed(east, policy, _attempt("east", "timeout"))
    assert book.availability(east) == "cooling"
    assert 9 <= book.cooling_left_s("east") <= 10
    await _settled(book)
    board.expire("east")
    assert await book.claim_probe(east, policy)
    book.failed(east, policy, _attempt("east", "server-error"))  # the probe failed
    assert book.availability(east) == "cooling"
    book.failed(east, policy, _attempt("east", "untranslatable"))  # not the deployment's fault
    await _settled(book)
    assert isinstance(await board.state("east"), Cooling)


async def test_no_deployment_left_is_a_429_with_the_soonest_retry() -> None:
    table, clock = _table(), Clock()
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    group = table.group("claude")
    assert group is not None
    only = group.deployments[0].spec
    health.failed(only, group.spec.health, _attempt("anthropic-main", "rate-limited", 7.2))
    plan = _plan(table, health, "claude", random.Random(SEED), clock)
    assert plan is not None
    assert await plan.next() is None
    error = plan.unavailable()
    assert isinstance(error, RouteUnavailableError)
    assert error.status == 429
    assert error.retry_after_s == 8


async def test_rpm_capacity_skips_a_deployment_for_the_rest_of_the_minute() -> None:
    routes = ROUTES.replace(b"weight = 3\n", b"weight = 3\n  rpm = 2\n", 1)
    table, clock = RouteTable(parse_routes(routes, ENV), ENV), Clock()
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    group = table.group("gpt-4o")
    assert group is not None
    east = group.deployments[0].spec
    health.sent(east)
    health.sent(east)
    assert health.availability(east) == "busy"
    clock.s += 61
    assert health.availability(east) == "ok"


async def _settled(book: HealthBook) -> None:
    """Let the book's writes to the board run (they are tasks)."""
    await book.stop()
    await book.start()


def test_probing_state_is_a_skip_for_other_gateways() -> None:
    clock = Clock()
    book = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    book.on_state(Probing("east", 5, clock.ns() + 10**10))
    table = _table()
    group = table.group("gpt-4o")
    assert group is not None
    assert book.availability(group.deployments[0].spec) == "probing"
    clock.s += 11
    assert book.availability(group.deployments[0].spec) == "probe"


def test_the_example_routes_file_checks() -> None:
    """deploy/routes.example.toml, as the docs show it, is a file the gateway starts with."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "routes.example.toml"
    env = {
        n: f"sk-{n.lower()}-0123456789"
        for n in ("OPENAI_API_KEY", "AZURE_EAST_KEY", "ANTHROPIC_API_KEY")
    }
    config = load_routes(str(path), env)
    assert list(config.groups) == ["gpt-4o", "claude-sonnet", "fast"]
    assert config.groups["gpt-4o"].fallbacks == ("claude-sonnet",)
    east = config.groups["gpt-4o"].deployments[1]
    assert east.price is not None
    assert east.price.input_pusd == 2_000_000
    assert config.groups["fast"].strategy == "least-in-flight"
    with pytest.raises(RoutesFileError, match="AZURE_EAST_KEY is not set"):
        load_routes(str(path), {k: v for k, v in env.items() if k != "AZURE_EAST_KEY"})


def test_a_changed_file_is_reloaded_and_a_bad_one_keeps_the_routes_in_force(
    tmp_path: Path,
) -> None:
    path = tmp_path / "routes.toml"
    path.write_bytes(ROUTES)
    table = RouteTable(load_routes(str(path), ENV), ENV)
    assert not table.reload_if_changed()  # unchanged
    path.write_bytes(ROUTES.replace(b'name = "three"', b'name = "four"'))
    assert table.reload_if_changed()
    assert "four" in table.names()
    assert "three" not in table.names()
    path.write_bytes(ROUTES.replace(b"weight = 3", b"weight = -3"))
    assert not table.reload_if_changed()
    assert "four" in table.names()  # the routes in force stay
    assert (table.reloads, table.reload_errors) == (1, 1)
    assert table.last_error is not None
    assert "$.models[0].deployments[0].weight" in table.last_error


def test_a_bad_routes_file_stops_the_gateway_with_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_bytes(ROUTES.replace(b'"claude"]', b'"nobody"]'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")} | {
        "TOKENWIRE_ROUTES_FILE": str(path),
        "TOKENWIRE_NATS_URL": "nats://127.0.0.1:1",
        **ENV,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tokenwire", "gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "$.models[0].fallbacks[0]: 'nobody' is not a model of this file" in lines[0]


async def test_a_plan_reaches_what_is_left_of_its_group_and_every_fallback_group() -> None:
    table, clock = _table(), Clock()
    health = HealthBook(None, clock_ns=clock.ns, monotonic=clock.mono)
    plan = _plan(table, health, "gpt-4o", random.Random(SEED), clock)
    assert plan is not None
    first = await plan.next()
    assert first is not None
    reach = [s.name for s in plan.reachable()]
    assert sorted(reach) == sorted([*({"east", "west"} - {first.spec.name}), "anthropic-main"])


class AwayForClaims(MemoryCooldowns):
    """The memory twin whose probe claims get no answer (the broker away for them)."""

    async def claim_probe(self, deployment: str, *, revision: int, seconds: float) -> ProbeClaim:
        raise RequestFailed(f"cooldown of {deployment}", "TimeoutError (memory twin)")


@pytest.mark.parametrize("shared", [False, True], ids=["no-board", "broker-away-for-the-claim"])
async def test_a_probe_that_ends_unanswered_holds_the_deployment_no_longer_than_its_bound(
    shared: bool,
) -> None:
    """A probe's request cancelled (or answered with a 400) before its first byte is neither
    answered nor failed: the deployment is this gateway's to probe again once the probe's
    bound passed, as it is every other gateway's, not skipped for good."""
    table, clock = _table(), Clock()
    group = table.group("gpt-4o")
    assert group is not None
    east, policy = group.deployments[0].spec, group.spec.health
    board = AwayForClaims(clock_ns=clock.ns) if shared else None
    book = HealthBook(board, clock_ns=clock.ns, monotonic=clock.mono)
    await book.start()
    book.failed(east, policy, _attempt("east", "rate-limited", retry_after_s=30))
    await _settled(book)
    if board is not None:
        board.expire("east")  # the cooldown's end marker: nothing more comes from the board
    else:
        clock.s += 31
    assert book.availability(east) == "probe"
    assert await book.claim_probe(east, policy)
    book.sent(east)
    book.done(east)  # the probing request was cancelled before its first byte
    assert book.availability(east) == "probing"
    clock.s += policy.first_byte_timeout_s + 5.0 + 1.0  # past the probe's bound
    assert book.availability(east) == "probe"
    await book.stop()


class HeldClaims(MemoryCooldowns):
    """The memory twin whose next probe claim (``hold_next``) waits twice, as a broker round
    trip does: before its compare-and-set (``at_claim`` until ``go``; the write on its way) and
    after it, stored and its watchers told (``held`` until ``release``; the answer on its way,
    so what the watch tells meanwhile arrives before it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_next = False
        self.at_claim, self.go = asyncio.Event(), asyncio.Event()
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def claim_probe(self, deployment: str, *, revision: int, seconds: float) -> ProbeClaim:
        hold, self.hold_next = self.hold_next, False
        if hold:
            self.at_claim.set()
            await self.go.wait()
        claim = await super().claim_probe(deployment, revision=revision, seconds=seconds)
        if hold:
            self.held.set()
            await self.release.wait()
        return claim


async def _due_on_two_gateways(
    board: HeldClaims, clock: Clock
) -> tuple[HealthBook, HealthBook, DeploymentSpec, HealthPolicy]:
    """Two gateways' books on one board, east cooled down by a 429 and now due for a probe."""
    group = _table().group("gpt-4o")
    assert group is not None
    east, policy = group.deployments[0].spec, group.spec.health
    books = [HealthBook(board, clock_ns=clock.ns, monotonic=clock.mono) for _ in range(2)]
    for book in books:
        await book.start()
    books[1].failed(east, policy, _attempt("east", "rate-limited", retry_after_s=30))
    await _settled(books[1])
    board.expire("east")
    assert all(isinstance(book.state("east"), ProbeDue) for book in books)
    return books[0], books[1], east, policy


async def test_a_lost_claims_answer_does_not_undo_the_health_the_watch_told_meanwhile() -> None:
    """Gateway B wins the probe; A's claim loses and reads B's probing state, and before that
    answer reaches A, B's probe answered and the watch told A the deployment is healthy. A keeps
    it healthy (before: A went back to B's probe and skipped a healthy deployment until the
    probe's bound passed, a 429 to its callers when it was the only one left)."""
    board, clock = HeldClaims(), Clock()
    a, b, east, policy = await _due_on_two_gateways(board, clock)
    board.hold_next = True
    claim = asyncio.create_task(a.claim_probe(east, policy))
    await asyncio.wait_for(board.at_claim.wait(), 5)
    assert await b.claim_probe(east, policy)  # B's write is stored first
    board.go.set()
    await asyncio.wait_for(board.held.wait(), 5)
    assert isinstance(a.state("east"), Probing)  # the watch told A of B's probe
    b.answered(east)
    await _settled(b)
    assert isinstance(a.state("east"), Healthy)
    board.release.set()
    assert not await asyncio.wait_for(claim, 5)
    assert a.availability(east) == "ok"
    await a.stop()
    await b.stop()


async def test_a_won_claims_answer_does_not_undo_a_cooldown_the_watch_told_meanwhile() -> None:
    """A wins the probe; before the answer reaches A, B's request already on its way gets a
    429 with retry-after and cools the deployment down again, which the watch tells A. A does
    not probe (before: A's answer put its probe back over B's cooldown, and the probe's first
    byte would have cleared that cooldown for every gateway)."""
    board, clock = HeldClaims(), Clock()
    a, b, east, policy = await _due_on_two_gateways(board, clock)
    board.hold_next = True
    board.go.set()
    claim = asyncio.create_task(a.claim_probe(east, policy))
    await asyncio.wait_for(board.held.wait(), 5)
    assert isinstance(await board.state("east"), Probing)  # A's claim is stored
    b.failed(east, policy, _attempt("east", "rate-limited", retry_after_s=30))
    await _settled(b)
    assert isinstance(a.state("east"), Cooling)
    board.release.set()
    assert not await asyncio.wait_for(claim, 5)
    assert a.availability(east) == "cooling"
    await a.stop()
    await b.stop()
