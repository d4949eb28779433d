"""What every command shares: settings, the broker URL, the topology, running until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import click

from tokenwire.broker import Topology, free_port
from tokenwire.cli._errors import UsageError
from tokenwire.config import Settings, load
from tokenwire.scrub import install_log_scrubbing


def settings(ctx: click.Context) -> Settings:
    """The settings of this invocation (environment, overridden by global flags)."""
    obj = ctx.find_root().obj
    if "settings" not in obj:
        obj["settings"] = load()
    value: Settings = obj["settings"]
    return value


def topology(s: Settings) -> Topology:
    """The broker topology these settings describe."""
    return Topology(partitions=s.partitions, replicas=s.replicas)


def port_or_free(host: str, port: int) -> int:
    """``port`` when it can be bound on ``host`` now, else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return free_port()
    return port


def nats_url(s: Settings, *, service: bool = False) -> str:
    """The configured NATS URL; else (not for services) the one ``demo``/``up`` recorded.

    Services refuse to start without an explicit URL: guessing would connect a production
    service to whatever a data directory happens to hold.
    """
    if s.nats_url:
        return s.nats_url
    recorded = None if service else s.recorded_nats_url()
    if recorded:
        return recorded
    hint = "" if service else f" and no URL recorded in {s.data_dir} (run `tokenwire up` first)"
    raise UsageError(f"TOKENWIRE_NATS_URL is not set{hint}")


def run_until_signal(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]], log_level: int = logging.INFO
) -> None:
    """Run ``main(stop)`` on a new event loop; SIGINT and SIGTERM set ``stop``."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install_log_scrubbing()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
