"""``GET /v1/responses/{id}`` on the in-memory twins: another tenant's response and an id no
step made answer the same 404 after the same reads (issue 43: an unknown provider-style id
took ~400 ms to 404, read five times 0.1 s apart, another tenant's ~8 ms). The claim is
checked as the sequence of broker reads each answer cost, not as a time: the reads are what
the time is made of (measured figures: docs/gateway.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import httpx

from tests.gateway._helpers import provider_env
from tokenwire.broker import (
    KeyBinding,
    MemoryPublisher,
    MemorySessionOwners,
    MemoryStepRegistry,
    Owner,
    StepRecord,
)
from tokenwire.services.gateway import (
    CannedUpstream,
    GatewayDeps,
    GatewaySettings,
    MemoryStepSource,
    create_app,
    parse_keys,
)
from tokenwire.services.gateway._resume.resume import response_alias
from tokenwire.services.gateway._routing.canned import CannedAnswer

KEY_A = "tw-tenant-a-SENTINEL-00112233445566778899aabbccddeeff"
KEY_B = "tw-tenant-b-SENTINEL-ffeeddccbbaa99887766554433221100"


def _keys() -> bytes:
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return (
        f'[[keys]]\nname = "a"\ntenant = "team-a"\nsha256 = "{digest(KEY_A)}"\n\n'
        f'[[keys]]\nname = "b"\ntenant = "team-b"\nsha256 = "{digest(KEY_B)}"\n'
    ).encode()


@dataclass
class Reads:
    """Every broker read a request made, in order: (operation, whether it found something)."""

    seen: list[tuple[str, bool]] = field(default_factory=list)


class CountingSteps(MemoryStepRegistry):
    reads: Reads

    async def key_binding(self, key_hash: str, ttl_s: float) -> KeyBinding | None:
        found = await super().key_binding(key_hash, ttl_s)
        self.reads.seen.append(("key_binding", found is not None))
        return found

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None:
        found = await super().record(session, turn, step)
        self.reads.seen.append(("record", found is not None))
        return found


class CountingOwners(MemorySessionOwners):
    reads: Reads

    async def retained(self, session: str) -> Owner | None:
        found = await super().retained(session)
        self.reads.seen.append(("owner", found is not None))
        return found


def _never(route: object, body: bytes) -> CannedAnswer:
    raise AssertionError("a retrieval never calls a provider")


async def test_another_tenants_response_and_an_unknown_id_cost_the_same_reads() -> None:
    reads = Reads()
    steps, owners = CountingSteps(), CountingOwners(retained_owners={"sa": Owner("team-a")})
    steps.reads = owners.reads = reads
    await steps.claim("sa", 0, 0, "fp")  # team-a's step, its answer named two ways:
    await steps.bind_key(response_alias("resp_0a1b2c3d"), KeyBinding("sa", 0, 0, ""), 1e9)
    sink = MemoryPublisher()
    deps = GatewayDeps(
        upstream=CannedUpstream(_never),
        sink=sink,
        steps=steps,
        owners=owners,
        history=MemoryStepSource(sink),
    )
    settings = GatewaySettings(named_keys=parse_keys(_keys()), provider_env=provider_env())
    app = create_app(settings, deps)
    transport = httpx.ASGITransport(app=app)
    answers: dict[str, tuple[int, str, list[str]]] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for response_id in (
            "resp_0a1b2c3d",
            "resp_ffffffff",  # provider-style: A's, unknown
            "resp_tw-0-0-sa",
            "resp_tw-0-0-sz",
        ):  # made from a step: A's, none
            reads.seen.clear()
            got = await client.get(
                f"/v1/responses/{response_id}", headers={"authorization": f"Bearer {KEY_B}"}
            )
            ops = [op for op, _ in reads.seen]  # what each read found differs, not its cost
            answers[response_id] = (got.status_code, got.text.replace(response_id, "ID"), ops)
    assert answers["resp_0a1b2c3d"] == answers["resp_ffffffff"]
    assert answers["resp_tw-0-0-sa"] == answers["resp_tw-0-0-sz"]
    for status, body, ops in answers.values():
        assert status == 404
        assert "no response 'ID' is retained" in body
        assert ops == ["key_binding", "record", "owner"]
