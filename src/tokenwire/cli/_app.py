"""The command group, its global flags and the one place errors become exit codes.

Exit codes: 0 success, 1 check failed, not found or not reachable (broker, store), 2 usage or
configuration error, 130 / 143 stopped by SIGINT / SIGTERM. Errors are one line on stderr,
never with a URL's credentials; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import sys
import traceback

import click

from tokenwire.broker import BrokerUnavailable
from tokenwire.cli._errors import (
    CheckFailedError,
    Interrupted,
    NotFoundError,
    UnreachableError,
    UsageError,
)
from tokenwire.config import ConfigError, without_userinfo
from tokenwire.providers import ProviderError
from tokenwire.store import StoreConfigError, StoreUnavailable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT = 0, 1, 2, 130
_USAGE = (UsageError, ConfigError, ProviderError, StoreConfigError)
_FAILED = (CheckFailedError, NotFoundError, UnreachableError, BrokerUnavailable, StoreUnavailable)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenwire", prog_name="tokenwire")
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
        returned = cli.main(args=argv, prog_name="tokenwire", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("tokenwire: stopped by SIGINT", err=True)
        return EXIT_SIGINT
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except Interrupted as exc:
        return _fail(exc, exc.exit_code, debug)
    except Exception as exc:
        return _fail(exc, exit_code(exc), debug)
    return returned if isinstance(returned, int) else EXIT_OK


def exit_code(exc: BaseException) -> int:
    """2 for a configuration error, else 1; a wrapped cause (``raise ... from``) counts."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _USAGE):
            return EXIT_USAGE
        if isinstance(seen, _FAILED):
            return EXIT_FAILED
        seen = seen.__cause__
    return EXIT_FAILED


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    click.echo(f"tokenwire: {without_userinfo(str(exc))}", err=True)
    return code
