"""The command group, its global flags and the one place errors become exit codes.

Exit codes: 0 success, 1 check failed, not found or not reachable (broker, store), 2 usage or
configuration error, 130 / 143 stopped by SIGINT / SIGTERM. Errors are one line on stderr,
never with a URL's credentials; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from tokenwire.cli._errors import Interrupted, UsageError
from tokenwire.config import without_userinfo
from tokenwire.scrub import scrub

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT = 0, 1, 2, 130


COMMANDS: dict[str, str] = {
    "demo": "_demo:demo",
    "up": "_demo:up",
    "gateway": "_services:gateway",
    "assembler": "_services:assembler",
    "telemetry": "_services:telemetry",
    "provision": "_services:provision",
    "reshard": "_services:reshard",
    "scripted-provider": "_scripted:scripted_provider",
    "fold": "_fold:fold",
    "keys": "_keys:keys",
    "limits": "_limits:limits",
    "replay": "_replay:replay",
    "tail": "_tail:tail",
    "messages": "_messages:messages",
    "status": "_status:status",
    "rebuild": "_rebuild:rebuild",
    "usage": "_usage:usage",
}
"""Each command's module and function, imported only when the command runs (or for --help):
``tokenwire status`` neither pays for nor needs what ``demo`` imports (openai)."""


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            loaded = importlib.import_module(f"tokenwire.cli.{module}")
        except ModuleNotFoundError as exc:
            extra = EXTRAS.get((exc.name or "").split(".")[0])
            if extra is None:
                raise
            return _needs_extra(cmd_name, exc.name or "", extra)
        command: click.Command = getattr(loaded, attr)
        return command


EXTRAS = {"openai": "demo", "psycopg": "postgres"}
"""Optional dependencies and the extra that installs each (pyproject.toml)."""


def _needs_extra(name: str, module: str, extra: str) -> click.Command:
    """A stand-in for a command whose optional dependency is not installed."""
    hint = f"`tokenwire {name}` needs {module}: pip install 'tokenwire[{extra}]'"

    def refuse(**_: object) -> None:
        raise UsageError(hint)

    return click.Command(
        name,
        callback=refuse,
        help=hint,
        short_help=f"(needs tokenwire[{extra}])",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenwire", prog_name="tokenwire")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tokenwire: a durable, replayable pipeline for LLM token streams."""
    ctx.obj = {"debug": debug}


def _register() -> None:
    """Nothing to do: commands load on first use (kept for callers that still call it)."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
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
    # The error classes are imported here, on the way out: a command that never needs the
    # broker (``scripted-provider``, ``--version``) does not import nats at start for them.
    from tokenwire.broker import BrokerUnavailable, LayoutConflict, ReshardRefused
    from tokenwire.cli._errors import CheckFailedError, NotFoundError, UnreachableError
    from tokenwire.config import ConfigError
    from tokenwire.providers import ProviderError
    from tokenwire.store import StoreConfigError, StoreUnavailable

    usage = (UsageError, ConfigError, ProviderError, StoreConfigError, LayoutConflict)
    failed = (
        CheckFailedError,
        NotFoundError,
        UnreachableError,
        BrokerUnavailable,
        StoreUnavailable,
        ReshardRefused,
    )
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, usage):
            return EXIT_USAGE
        if isinstance(seen, failed):
            return EXIT_FAILED
        seen = seen.__cause__
    return EXIT_FAILED


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    click.echo(f"tokenwire: {scrub(without_userinfo(str(exc)))}", err=True)
    return code
