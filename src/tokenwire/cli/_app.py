"""The command group, its global flags and the one place errors become exit codes.

Exit codes: 0 success, 1 check failed or not found, 2 usage or configuration error.
Errors are one line on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import sys
import traceback

import click

from tokenwire.cli._errors import CheckFailedError, NotFoundError, UsageError
from tokenwire.config import ConfigError
from tokenwire.providers import ProviderError
from tokenwire.scrub import scrub

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tokenwire: a durable, replayable pipeline for LLM token streams."""
    ctx.obj = {"debug": debug}


def _register() -> None:
    # Imported here so that `tokenwire --help` stays fast and each command module is optional
    # reading for the others.
    from tokenwire.cli import _demo, _fold, _services

    cli.add_command(_fold.fold)
    cli.add_command(_demo.demo)
    cli.add_command(_demo.up)
    cli.add_command(_services.telemetry)
    cli.add_command(_services.gateway)
    cli.add_command(_services.assembler)
    cli.add_command(_services.provision)
    cli.add_command(_services.scripted_provider)
    from tokenwire.cli import _messages, _rebuild, _replay, _status, _tail

    cli.add_command(_replay.replay)
    cli.add_command(_tail.tail)
    cli.add_command(_messages.messages)
    cli.add_command(_status.status)
    cli.add_command(_rebuild.rebuild)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    _register()
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="tokenwire", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_FAILED
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except (UsageError, ConfigError, ProviderError) as exc:
        return _fail(exc, EXIT_USAGE, debug)
    except (CheckFailedError, NotFoundError) as exc:
        return _fail(exc, EXIT_FAILED, debug)
    except Exception as exc:
        return _fail(exc, EXIT_FAILED, debug)
    return EXIT_OK


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    click.echo(f"tokenwire: {scrub(str(exc))}", err=True)
    return code
