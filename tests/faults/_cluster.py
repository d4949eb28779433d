"""The fault tier's broker: three nats-server processes from deploy/nats (loopback), R3.

Reuses tests/deploy/_nats (the committed node and accounts files, rewritten for loopback only).
Which node holds what is asked of the cluster itself (stream, KV and consumer leaders, the
gateway's connection from each node's /connz), never assumed.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nats.aio.client import Client

from tests.deploy._nats import Node, urls_for, write_node_configs
from tokenwire.broker import Topology

HEALTH_BOUND_S = 60.0
Target = Literal["stream-leader", "follower", "gateway-node", "kv-leader", "consumer-leader"]
TARGETS: tuple[Target, ...] = (
    "stream-leader",
    "follower",
    "gateway-node",
    "kv-leader",
    "consumer-leader",
)


@dataclass
class Cluster:
    nodes: list[Node]

    @classmethod
    def start(cls, workdir: Path) -> Cluster:
        configs = write_node_configs(workdir)
        nodes = [Node(path, ports, f"nats-{i}") for i, (path, ports) in enumerate(configs, 1)]
        try:
            for node in nodes:
                node.start()
            for node in nodes:
                node.wait_accepting()
        except BaseException:  # a node that did not come up: stop the others, leak nothing
            for node in nodes:
                node.stop()
            raise
        return cls(nodes)

    def urls(self, user: str) -> str:
        return urls_for(self.nodes, user)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def logs(self) -> str:
        return "\n".join(node.log() for node in self.nodes)

    async def wait_healthy(self) -> None:
        """Every node answers /healthz (JetStream current: streams and consumers caught up)."""
        deadline = time.monotonic() + HEALTH_BOUND_S
        while not all(_healthy(n) for n in self.nodes):
            assert time.monotonic() < deadline, "cluster not healthy:\n" + self.logs()[-3000:]
            await asyncio.sleep(0.2)

    def gateway_node(self) -> str:
        """The node the gateway process is connected to (its /connz, by client name)."""
        for node in self.nodes:
            url = f"http://127.0.0.1:{node.ports.http}/connz?limit=1024"
            with urllib.request.urlopen(url, timeout=2) as response:
                conns = json.load(response).get("connections") or []
            if any(c.get("name") == "tokenwire-gateway" for c in conns):
                return node.name
        raise AssertionError("the gateway is connected to no node")

    async def target(self, operator: Client, topology: Topology, target: Target) -> str:
        """The name of the node holding ``target`` right now."""
        js = operator.jetstream()
        match target:
            case "stream-leader":
                return _leader((await js.stream_info(topology.chunk_streams[0])).cluster)
            case "follower":
                cluster = (await js.stream_info(topology.chunk_streams[0])).cluster
                assert cluster is not None
                assert cluster.replicas
                return str(cluster.replicas[0].name)
            case "gateway-node":
                return self.gateway_node()
            case "kv-leader":
                return _leader((await js.stream_info(f"KV_{topology.steps_bucket}")).cluster)
            case "consumer-leader":
                stream = topology.stream_of_partition(0)
                info = await js.consumer_info(stream, topology.assembler_consumer(0))
                return _leader(info.cluster)


def _leader(cluster: object) -> str:
    leader = getattr(cluster, "leader", None)
    assert leader, f"no leader: {cluster}"
    return str(leader)


def _healthy(node: Node) -> bool:
    url = f"http://127.0.0.1:{node.ports.http}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
