"""The flags of every command, generated from :mod:`tokenwire.variables` (one row, one flag).

A flag given on the command line is applied as its variable for the duration of the command
(and restored after), so every reader of the environment sees one value, checked by one
parser; flags win over the environment.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from tokenwire.variables import Variable, for_command

F = TypeVar("F", bound=Callable[..., Any])


def variable_flags(command: str) -> Callable[[F], F]:
    """Add one option per variable ``command`` takes; apply the given ones as variables."""
    rows = for_command(command)

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {v.env: _value(v, kwargs.pop(_param(v), None)) for v in rows}
            with applied({k: v for k, v in given.items() if v is not None}):
                return f(*args, **kwargs)

        for v in reversed(rows):
            wrapper = _option(v)(wrapper)
        return wrapper  # type: ignore[return-value]  # click's decorator returns the wrapped command

    return decorate


def _param(v: Variable[Any]) -> str:
    return "var_" + v.env.lower()


def _value(v: Variable[Any], given: object) -> str | None:
    if given is None or given is False:
        return None
    return "1" if v.switch else str(given)


def _option(v: Variable[Any]) -> Callable[[F], F]:
    text = v.meaning.replace("`", "")
    shown = v.shown_default.replace("`", "")
    help_text = f"{text} [env {v.env}; default {shown}]"
    if v.switch:
        return click.option(f"--{v.flag}", _param(v), is_flag=True, default=False, help=help_text)
    return click.option(f"--{v.flag}", _param(v), default=None, metavar="VALUE", help=help_text)


@contextmanager
def applied(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back what was there."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
