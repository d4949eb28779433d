"""``tokenwire scripted-provider``: the offline upstream as a command. Its own module, apart
from the services that talk to the broker (``_services``): it needs neither the broker nor the
store, and starts without importing them."""

from __future__ import annotations

import asyncio

import click

from tokenwire.cli._flags import variable_flags
from tokenwire.cli._running import run_until_signal


@click.command("scripted-provider")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--rate", default=0.0, show_default=True, help="Fragments per second (0 = max).")
@click.option("--fragments", default=8, show_default=True, help="Fragments per text scenario.")
@click.option("--fragment-size", default=4, show_default=True, help="Characters per fragment.")
@click.option("--stall", default=30.0, show_default=True, help="Seconds the stall scenario stalls.")
@click.option("--seed", default=0, show_default=True)
@click.option("--recording", type=click.Path(exists=True, dir_okay=False), help="File to replay.")
@click.option(
    "--recording-root",
    type=click.Path(exists=True, file_okay=False),
    help="Folder the X-Scripted-Recording header may select files from.",
)
@variable_flags("scripted-provider")
def scripted_provider(
    *,
    host: str,
    port: int,
    rate: float,
    fragments: int,
    fragment_size: int,
    stall: float,
    seed: int,
    recording: str | None,
    recording_root: str | None,
) -> None:
    """Run the offline upstream: OpenAI- and Anthropic-compatible scripted streams."""

    from tokenwire.services import scripted_provider as service

    config = service.ScriptedSettings(
        token_rate=rate,
        fragment_size=fragment_size,
        length=fragments,
        stall_s=stall,
        seed=seed,
        recording=recording,
        recording_root=recording_root,
    )

    async def main(stop: asyncio.Event) -> None:
        task = asyncio.create_task(service.run(host, port, config))
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for t in (task, waiter):
            t.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)

    run_until_signal(main)
