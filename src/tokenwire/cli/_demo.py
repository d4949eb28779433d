"""``tokenwire demo``: the embedded stack and a demo fleet."""

from __future__ import annotations

import click


@click.command()
def demo() -> None:
    """Run the embedded stack and a demo fleet of agent sessions."""
    click.echo("tokenwire is installed; the demo fleet arrives with the gateway and assembler.")
