"""What this gateway knows of each routed deployment's health and load (docs/gateway.md,
"Routes"; ADR 0040).

- **Shared cooldowns** come from the broker (``broker.CooldownBoard``): the book watches it and
  keeps each deployment's last state, so a pick reads a dict and never waits for the broker.
  A deployment is cooled down, for every gateway, when it answers 429 with ``retry-after``
  (for that long, at most the group's ``max_cooldown_s``) or fails ``failures`` times within
  ``window_s`` as this gateway counts (for ``cooldown_s``). This gateway applies its own
  cooldown at once; the write reaches the others through the bucket.
- **One probe**: once a cooldown ended, the first gateway whose request picks the deployment
  wins it by compare-and-set (``claim_probe``); its request is the probe, the others skip the
  deployment until the probe answers (healthy: ``clear``) or fails (cooled down again).
- **Load**: requests in flight (least-in-flight balancing) and, against a deployment's
  ``rpm`` / ``tpm``, the requests sent and tokens reported in the last 60 s, per gateway.

Without a board (no broker, unit tests) or while the broker does not answer, cooldowns and
probes are this gateway's alone, and the failure is logged and counted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, assert_never

from tokenwire.broker import (
    BoardWatch,
    BrokerError,
    CooldownBoard,
    Cooling,
    DeploymentState,
    Healthy,
    ProbeClaim,
    ProbeDue,
    Probing,
    cancel_task,
)
from tokenwire.schemas import FailedAttempt
from tokenwire.services.gateway._routing.routes_file import DeploymentSpec, HealthPolicy

log = logging.getLogger("tokenwire.gateway")

Availability = Literal["ok", "probe", "cooling", "probing", "busy"]
"""A deployment for a new request: send to it; send only as the probe (claim it first); skip
it (cooling down, another gateway's probe running, at its capacity)."""
_NS = 1_000_000_000
_MINUTE_S = 60.0
_HEALTH_FAILURES = frozenset({"connect", "timeout", "rate-limited", "server-error", "overloaded"})
REWATCH_S = 5.0
"""How often a gateway that cannot watch the shared cooldowns tries again."""
_PROBE_CLAIM_S = 2.0
"""How long a probe claim may wait for the broker before the deployment is skipped."""


@dataclass
class _Load:
    """One deployment's load on this gateway."""

    in_flight: int = 0
    sent: collections.deque[float] = field(default_factory=collections.deque)
    tokens: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    token_sum: int = 0
    failures: collections.deque[float] = field(default_factory=collections.deque)


class HealthBook:
    """The deployments' health and load as this gateway sees them (see the module)."""

    def __init__(
        self,
        board: CooldownBoard | None,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._board = board
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._states: dict[str, DeploymentState] = {}
        self._floor: dict[str, int] = {}  # revisions at or below it are older than ours
        self._probes: set[str] = set()  # the deployments this gateway's requests probe
        self._loads: dict[str, _Load] = collections.defaultdict(_Load)
        self._watch: BoardWatch | None = None
        self._rewatch: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.board_errors = 0

    # -- the shared states ------------------------------------------------------------------

    async def start(self) -> None:
        """Watch the board (every deployment's state now, then each change); while it cannot
        be watched (the broker away, the bucket missing), try again every
        :data:`REWATCH_S`, making the bucket again where this gateway may."""
        if self._board is None or self._watch is not None or self._rewatch is not None:
            return
        if not await self._open_watch():
            self._rewatch = asyncio.create_task(self._keep_trying(), name="cooldowns watch")

    async def _open_watch(self) -> bool:
        assert self._board is not None
        try:
            self._watch = await self._board.watch(self.on_state)
        except BrokerError as exc:
            self._board_failed("watch", exc)
            return False
        return True

    async def _keep_trying(self) -> None:
        assert self._board is not None
        while True:
            await asyncio.sleep(REWATCH_S)
            try:
                await self._board.ensure()
            except BrokerError as exc:
                self._board_failed("making the bucket", exc)
            if await self._open_watch():
                self._rewatch = None
                return

    async def stop(self) -> None:
        """Stop watching; wait (bounded) for the writes still on their way."""
        if self._rewatch is not None:
            await cancel_task(self._rewatch)
            self._rewatch = None
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)

    def on_state(self, state: DeploymentState) -> None:
        """A state the board stored (the watch's callback): kept unless older than ours."""
        if state.revision and state.revision <= self._floor.get(state.deployment, 0):
            return
        self._states[state.deployment] = state
        if isinstance(state, (Cooling, Healthy)):
            self._probes.discard(state.deployment)

    def state(self, name: str) -> DeploymentState:
        """The deployment's state as this gateway knows it."""
        return self._states.get(name) or Healthy(name, 0)

    def availability(self, d: DeploymentSpec) -> Availability:
        """Whether a new request may go to ``d`` now (see :data:`Availability`)."""
        state = self._states.get(d.name)
        if state is None and d.rpm is None and d.tpm is None:
            return "ok"  # the usual case: one lookup
        if state is not None and not isinstance(state, Healthy):
            shared = self._shared(state, self._clock_ns())
            if shared != "ok":
                return shared
        return "busy" if self._at_capacity(d) else "ok"

    def _shared(self, state: DeploymentState, now_ns: int) -> Availability:
        match state:
            case Cooling():
                return "cooling" if now_ns < state.until_ns else "probe"
            case Probing():
                # ours too: a probe whose request ended unanswered (cancelled, a 400) holds
                # the deployment no longer than its bound, as the broker's TTL holds it
                return "probing" if now_ns < state.until_ns else "probe"
            case ProbeDue():
                return "probe"
            case Healthy():
                return "ok"
            case _:
                assert_never(state)

    def cooling_left_s(self, name: str) -> float:
        """Seconds until the deployment's cooldown (or another's probe) ends; 0 when none."""
        state = self._states.get(name)
        if isinstance(state, (Cooling, Probing)):
            return max(0.0, (state.until_ns - self._clock_ns()) / _NS)
        return 0.0

    async def claim_probe(self, d: DeploymentSpec, policy: HealthPolicy) -> bool:
        """Try to become the deployment's one prober (its cooldown ended); True: this
        request is the probe."""
        state = self.state(d.name)
        if self._shared(state, self._clock_ns()) != "probe":
            return False  # another gateway's probe (or a new cooldown) arrived meanwhile
        if self._board is None:
            won = True
        else:
            try:
                async with asyncio.timeout(_PROBE_CLAIM_S):
                    claim = await self._board.claim_probe(
                        d.name, revision=state.revision, seconds=_probe_bound(policy)
                    )
            except (BrokerError, TimeoutError) as exc:
                self._board_failed(f"probe claim of {d.name}", exc)
                won = True  # the broker is away: this gateway probes on its own
            else:
                won = self._claimed(state, claim)
        if won:
            self._probes.add(d.name)
            until = self._clock_ns() + int(_probe_bound(policy) * _NS)
            self._states[d.name] = Probing(d.name, self.state(d.name).revision, until)
        return won

    def _claimed(self, asked: DeploymentState, claim: ProbeClaim) -> bool:
        """Whether this request probes, from the claim's answer (asked at ``asked``): the
        watch (or this gateway's own cooldown) may have told a newer state while the answer
        was on its way, and that one stands (the answer would put back a probe over it)."""
        name, answer = asked.deployment, claim.state
        held = self.state(name)
        if held is not asked and (held.revision == 0 or held.revision > answer.revision):
            return False
        self._floor[name] = max(self._floor.get(name, 0), answer.revision - 1)
        self.on_state(answer)
        return claim.won

    # -- outcomes ---------------------------------------------------------------------------

    def sent(self, d: DeploymentSpec) -> None:
        """A request is on its way to ``d``."""
        load = self._loads[d.name]
        load.in_flight += 1
        if d.rpm is not None:
            load.sent.append(self._monotonic())

    def done(self, d: DeploymentSpec, tokens: int = 0) -> None:
        """The request to ``d`` ended (``tokens``: what its usage reported)."""
        load = self._loads[d.name]
        load.in_flight = max(0, load.in_flight - 1)
        if d.tpm is not None and tokens:
            load.tokens.append((self._monotonic(), tokens))
            load.token_sum += tokens

    def in_flight(self, name: str) -> int:
        """Requests this gateway has on their way to the deployment now."""
        load = self._loads.get(name)
        return 0 if load is None else load.in_flight

    def answered(self, d: DeploymentSpec) -> None:
        """``d`` sent its first chunk: a probe this gateway held succeeded."""
        if d.name in self._probes:
            self._probes.discard(d.name)
            self._states[d.name] = Healthy(d.name, 0)
            self._write(d.name, lambda board: board.clear(d.name))

    def failed(self, d: DeploymentSpec, policy: HealthPolicy, attempt: FailedAttempt) -> None:
        """``d`` failed before its first byte: a 429 with ``retry-after`` (or a failed probe)
        cools it down at once, other failures count towards ``policy.failures``."""
        if attempt.failure not in _HEALTH_FAILURES:
            return
        if attempt.retry_after_s is not None and attempt.failure == "rate-limited":
            seconds = min(max(1.0, attempt.retry_after_s), policy.max_cooldown_s)
            reason = f"{attempt.status or 429} retry-after {attempt.retry_after_s:g} s"
            self._cool(d.name, seconds, reason)
        elif d.name in self._probes:
            self._cool(d.name, policy.cooldown_s, f"probe failed: {attempt.failure}")
        else:
            self._count_failure(d.name, policy, attempt)

    def _count_failure(self, name: str, policy: HealthPolicy, attempt: FailedAttempt) -> None:
        """One more failure in the window; ``policy.failures`` of them cool it down."""
        load, now = self._loads[name], self._monotonic()
        load.failures.append(now)
        while load.failures and load.failures[0] <= now - policy.window_s:
            load.failures.popleft()
        if len(load.failures) >= policy.failures:
            load.failures.clear()
            why = f"{policy.failures} failures within {policy.window_s:g} s ({attempt.failure})"
            self._cool(name, policy.cooldown_s, why)

    def _cool(self, name: str, seconds: float, reason: str) -> None:
        """Cool ``name`` down here at once, and for every gateway through the board."""
        self._probes.discard(name)
        self._floor[name] = self.state(name).revision
        until = self._clock_ns() + int(seconds * _NS)
        self._states[name] = Cooling(name, 0, until, reason)
        log.warning("deployment %s cooling down for %g s: %s", name, seconds, reason)
        self._write(name, lambda board: board.cool(name, reason=reason, seconds=seconds))

    def _write(self, name: str, write: Callable[[CooldownBoard], Awaitable[None]]) -> None:
        board = self._board
        if board is None:
            return

        async def send() -> None:
            try:
                async with asyncio.timeout(_PROBE_CLAIM_S):
                    await write(board)
            except (BrokerError, TimeoutError) as exc:
                self._board_failed(f"cooldown of {name}", exc)

        task = asyncio.create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _board_failed(self, what: str, exc: BaseException) -> None:
        self.board_errors += 1
        log.warning("shared cooldowns: %s failed (this gateway's view only): %s", what, exc)

    def _at_capacity(self, d: DeploymentSpec) -> bool:
        if d.rpm is None and d.tpm is None:
            return False
        load, since = self._loads[d.name], self._monotonic() - _MINUTE_S
        while load.sent and load.sent[0] <= since:
            load.sent.popleft()
        while load.tokens and load.tokens[0][0] <= since:
            load.token_sum -= load.tokens.popleft()[1]
        if d.rpm is not None and len(load.sent) >= d.rpm:
            return True
        return d.tpm is not None and load.token_sum >= d.tpm

    def capacity_left_s(self, name: str) -> float:
        """Seconds until the oldest request or tokens of the last minute leave the window."""
        load = self._loads.get(name)
        if load is None:
            return 0.0
        starts = [load.sent[0]] if load.sent else []
        if load.tokens:
            starts.append(load.tokens[0][0])
        return max(0.0, min(starts) + _MINUTE_S - self._monotonic()) if starts else 0.0


def _probe_bound(policy: HealthPolicy) -> float:
    """How long a probe may hold the deployment: its first byte's bound, and a margin."""
    return policy.first_byte_timeout_s + 5.0
