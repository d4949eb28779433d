"""The deployed way to run: `tokenwire provision` as `provisioner`, then the services as their
own least-privilege users with TOKENWIRE_PROVISION=0, on a real nats-server loaded with the
committed deploy/nats/accounts.conf. Real processes, real HTTP over a socket."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy._nats import (
    Node,
    NodePorts,
    close,
    connect_as,
    provision,
    run_provision,
    running,
    server_env,
)
from tests.deploy.test_nats_config import STEP, _single_node_config
from tokenwire.broker import ChunkPublisher, Topology, free_port
from tokenwire.schemas import ChunkEnvelope, json_encoder

READY_TIMEOUT_S = 30.0
T0 = 1_700_000_000_000_000_000


def _single_node(tmp_path: Path) -> Node:
    port = free_port()
    return Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")


def _service_env(tmp_path: Path, nats_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in server_env().items() if not k.startswith("TOKENWIRE_")}
    return env | {
        "TOKENWIRE_NATS_URL": nats_url,
        "TOKENWIRE_PROVISION": "0",
        "TOKENWIRE_PARTITIONS": "16",
        "TOKENWIRE_DATA_DIR": str(tmp_path / "data"),
        **extra,
    }


@contextlib.contextmanager
def _service(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``tokenwire ARGS`` as its own process; SIGTERM (then SIGKILL) at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _get(url: str, proc: subprocess.Popen[bytes], log: Path, key: str | None = None) -> str:
    """The body of the first 200 from ``url``, polled while the service starts (bounded)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=5
            ) as response,
        ):
            return str(response.read().decode())
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered 200:\n{log.read_text()[-3000:]}")


def _status(url: str, key: str, body: bytes | None = None, **headers: str) -> int:
    """The status of one request with ``key`` (a POST when ``body`` is given)."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json", **headers}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


TENANT_KEY, OPS_KEY = "tw-tenant-" + "1" * 32, "tw-ops-" + "2" * 32


def _keys_file(path: Path) -> Path:
    digest = {k: hashlib.sha256(k.encode()).hexdigest() for k in (TENANT_KEY, OPS_KEY)}
    tenant = f'[[keys]]\nname = "team-a"\nsha256 = "{digest[TENANT_KEY]}"\n'
    ops = f'[[keys]]\nname = "ops"\nscope = "operator"\nsha256 = "{digest[OPS_KEY]}"\n'
    path.write_text(tenant + ops)
    return path


async def _publish_step(url: str) -> None:
    """The recorded step, published as the gateway user (the first chunk with its request
    time, as the gateway stamps it: the telemetry consumer's input)."""
    conn = await connect_as("gateway", url)
    publisher = await ChunkPublisher(conn.nc, Topology()).start()
    try:
        for ordinal, chunk in enumerate(STEP):
            request_time = T0 - 250_000_000 if ordinal == 0 else None
            envelope = ChunkEnvelope(
                "sess-a",
                0,
                0,
                ordinal,
                T0 + ordinal,
                "prov",
                "mod",
                chunk,
                request_time_ns=request_time,
            )
            await publisher.publish(
                json_encoder.encode(envelope), "sess-a", 0, 0, ordinal, first=ordinal == 0
            )
        await publisher.wait_acked("sess-a", 0, 0)
    finally:
        await publisher.close()
        await close(conn)


@pytest.mark.slow
def test_gateway_and_telemetry_serve_as_their_users_without_provisioning(tmp_path: Path) -> None:
    node = _single_node(tmp_path)
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        asyncio.run(_publish_step(node.url("gateway")))
        gw_port, metrics_port = free_port(), free_port()
        gw_env = _service_env(
            tmp_path,
            node.url("gateway"),
            TOKENWIRE_GATEWAY_ADDR=f"127.0.0.1:{gw_port}",
            TOKENWIRE_STORE=f"sqlite:///{tmp_path / 'store.db'}",
            TOKENWIRE_GATEWAY_KEYS_FILE=str(_keys_file(tmp_path / "keys.toml")),
            TOKENWIRE_SCRIPTED_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",  # refuses
        )
        tel_env = _service_env(tmp_path, node.url("telemetry"))
        tel_args = ["telemetry", "--metrics-addr", f"127.0.0.1:{metrics_port}"]
        gw_log, tel_log = tmp_path / "gateway.log", tmp_path / "telemetry.log"
        with (
            _service(["gateway"], gw_env, gw_log) as gateway,
            _service(tel_args, tel_env, tel_log) as telemetry,
        ):
            base = f"http://127.0.0.1:{gw_port}"
            _get(f"{base}/readyz", gateway, gw_log)  # connected, the chunk stream answers
            # The replay route reads the stream under the gateway user: every chunk, in order.
            events = f"{base}/v1/sessions/{{}}/events?follow=false"
            sse = _get(events.format("sess-a"), gateway, gw_log, OPS_KEY)
            assert re.findall(r"^id: (\d+)$", sse, re.M) == ["1", "2", "3", "4", "5", "6"]
            # A tenant key: the session's owner read by subject, under the gateway user (a
            # refused read would be a 503); sess-a has no tenant, so it is unknown to it.
            assert _status(events.format("sess-a"), TENANT_KEY) == 404
            # Its model call writes the new session's owner record, then the provider's
            # refusal is recorded as the step (502): a session of its own it reads.
            call = b'{"model": "scripted/text", "messages": [{"role": "user", "content": "x"}]}'
            url = f"{base}/v1/chat/completions"
            assert _status(url, TENANT_KEY, call, **{"x-tokenwire-session": "sess-t"}) == 502
            assert "id: " in _get(events.format("sess-t"), gateway, gw_log, TENANT_KEY)
            # The telemetry consumer pulled the first chunk with its durable consumer.
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            started = 'tokenwire_stream_starts_total{model="mod",provider="prov"} 1.0'
            deadline = time.monotonic() + READY_TIMEOUT_S
            while started not in _get(metrics_url, telemetry, tel_log):
                assert time.monotonic() < deadline, _get(metrics_url, telemetry, tel_log)
                time.sleep(0.1)
        # Neither service tried anything its user may not do (provisioning included).
        assert "permissions violation" not in node.log().lower()
        for log in (gw_log, tel_log):
            assert "permissions violation" not in log.read_text().lower(), log.name


@pytest.mark.slow
def test_provision_fails_with_the_exit_codes_compose_and_the_job_act_on(tmp_path: Path) -> None:
    """Not 0 means the services do not start (compose: service_completed_successfully; the
    Job retries): 1 when the broker refuses, 2 when the configuration is wrong."""
    node = _single_node(tmp_path)
    with running([node]):
        refused = run_provision(node.url("provisioner"), replicas=3, timeout_s=0)
    assert refused.returncode == 1, refused.stderr
    assert "replicas > 1 not supported in non-clustered mode" in refused.stderr
    unconfigured = run_provision(None, replicas=1)
    assert unconfigured.returncode == 2, unconfigured.stderr
    assert "TOKENWIRE_NATS_URL" in unconfigured.stderr
