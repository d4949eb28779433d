"""One row of the catalogue: a variable's name, parser, default and flag (:class:`Variable`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Variable(Generic[T]):
    """One setting. ``parse`` turns its text into its value; ``default`` is its text when
    unset (empty: absent, ``shown`` says what that means where it is not plain); ``flag`` is
    the option name without ``--``; ``switch``: a flag without a value that sets the variable
    to ``1``; ``secret``: its value is never shown."""

    env: str
    flag: str
    parse: Callable[[str, str], T]
    default: str
    meaning: str
    commands: tuple[str, ...]
    shown: str = ""
    switch: bool = False
    secret: bool = False

    def read(self, env: Mapping[str, str]) -> T:
        """The value in ``env``, else the default; :class:`ConfigError` for a malformed one."""
        return self.parse(self.env, env.get(self.env, self.default))

    @property
    def value(self) -> T:
        """The default's value."""
        return self.parse(self.env, self.default)

    @property
    def shown_default(self) -> str:
        """The default as the reference table shows it."""
        return self.shown or (f"`{self.default}`" if self.default else "absent")
