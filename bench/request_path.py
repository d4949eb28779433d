"""Which tokenwire modules one streaming request runs through, in the order it first enters
them (issue 13's walk, measured instead of read).

``python -m bench.request_path`` starts an embedded nats-server, the scripted provider and the
gateway in this process, makes one warm-up request, then traces (``sys.setprofile``) one
streaming OpenAI Chat Completions request to an Anthropic-dialect model (``anthropic/tools``,
the scripted provider playing the Messages API) from the SDK call to the stream's end. It
prints every ``src/tokenwire`` module that ran code for it, grouped by package, with the
count, and how often control came back to a module it had left for another one (a "return":
the sequence of module changes, collapsed, minus the distinct modules). Background work of the
same process (the publisher's acks, the step's own task) is part of the request's path and is
counted; the scripted provider and nats-server are not tokenwire code on the path.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

import openai

from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenwire"
KEY = "request-path-key"
SKIP = ("services/scripted_provider/",)


def _module(filename: str) -> str | None:
    if not filename.startswith(str(SRC)):
        return None
    rel = filename[len(str(SRC)) + 1 :]
    return None if rel.startswith(SKIP) else rel


class Tracer:
    def __init__(self) -> None:
        self.order: list[str] = []  # module changes, collapsed

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame.f_code.co_filename)
        if module is not None and (not self.order or self.order[-1] != module):
            self.order.append(module)


async def _request(url: str) -> None:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="anthropic/tools",
            stream=True,
            messages=[{"role": "user", "content": "weather?"}],
        )
        async for _ in stream:
            pass


async def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedServer(Path(data)).start()
        try:
            await _traced(server.url)
        finally:
            server.stop()


async def _traced(nats_url: str) -> None:
    nc = await connect(nats_url)
    topology = Topology()
    await ensure_topology(nc, topology)
    async with ScriptedServer(ScriptedSettings(seed=11, length=12)) as scripted:
        env = {"TOKENWIRE_ANTHROPIC_BASE_URL": scripted.url, "TOKENWIRE_ANTHROPIC_API_KEY": "x"}
        settings = GatewaySettings(port=0, keys=frozenset({KEY}), provider_env=env)
        real = await broker_deps(nc, topology)
        try:
            async with GatewayServer(settings, real.deps) as gateway:
                await _request(gateway.url)  # warm: imports, connections, first-use setup
                tracer = Tracer()
                sys.setprofile(tracer)
                try:
                    await _request(gateway.url)
                finally:
                    sys.setprofile(None)
        finally:
            await real.aclose()
            await nc.close()
    _report(tracer.order)


def _report(order: list[str]) -> None:
    distinct = list(dict.fromkeys(order))
    by_package: dict[str, list[str]] = defaultdict(list)
    for module in distinct:
        by_package[_package(module)].append(module)
    for package, modules in by_package.items():
        print(f"{package} ({len(modules)}): {', '.join(m.rsplit('/', 1)[-1] for m in modules)}")
    walk = [_package(m) for m in distinct]
    hops = [p for i, p in enumerate(walk) if i == 0 or walk[i - 1] != p]
    print("first entries, by package: " + " -> ".join(hops))
    print(
        f"{len(distinct)} modules in {len(by_package)} packages; "
        f"{len(hops) - len(set(hops))} returns to a package left before"
    )


def _package(module: str) -> str:
    parts = module.split("/")
    return "/".join(parts[:2]) if parts[0] == "services" else parts[0].removesuffix(".py")


if __name__ == "__main__":
    asyncio.run(main())
