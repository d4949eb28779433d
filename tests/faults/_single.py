"""A single JetStream node with the committed accounts file (R1), the process and store
faults' broker (broker faults have their own three-node cluster), provisioned as deployed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.deploy._nats import Node, NodePorts, provision, running
from tests.deploy.test_nats_config import _single_node_config
from tokenwire.broker import Topology, free_port

TOPOLOGY = Topology(partitions=16, replicas=1)


@contextlib.contextmanager
def single_node(workdir: Path) -> Iterator[Node]:
    port = free_port()
    node = Node(_single_node_config(workdir, port), NodePorts(port, 0, 0), "single")
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        yield node
