"""EmbeddedServer and EmbeddedCluster start the real binary on free loopback ports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.broker import close_client
from tokenwire.broker import (
    URL_FILE,
    EmbeddedCluster,
    EmbeddedServer,
    ServerStartError,
    Topology,
    TopologyError,
    connect,
    ensure_topology,
)


async def test_embedded_server_serves_jetstream_and_records_its_url(tmp_path: Path) -> None:
    async with EmbeddedServer(tmp_path, write_url_file=True) as server:
        assert not server.url.endswith(":4222")
        assert (tmp_path / URL_FILE).read_text().strip() == server.url
        nc = await connect(server.url)
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        await close_client(nc)
    assert not server.running
    assert (tmp_path / "jetstream").is_dir()


def test_a_missing_binary_is_a_typed_error(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path, binary=str(tmp_path / "no-such-nats-server"))
    with pytest.raises(ServerStartError):
        server.start()


@pytest.mark.slow
async def test_three_node_cluster_hosts_a_replicated_topology(tmp_path: Path) -> None:
    async with EmbeddedCluster(tmp_path, nodes=3) as cluster:
        nc = await connect(",".join(cluster.urls))
        try:
            topology = Topology(prefix="c", replicas=3, partitions=2, max_bytes=64 * 1024**2)
            for _ in range(100):  # the meta leader is elected a moment after the routes form
                try:
                    await ensure_topology(nc, topology)
                    break
                except TopologyError:
                    await asyncio.sleep(0.1)
            info = await nc.jetstream().stream_info(topology.stream)
            assert info.config.num_replicas == 3
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2
        finally:
            await close_client(nc)
