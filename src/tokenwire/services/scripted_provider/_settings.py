"""Settings of the scripted provider and the per-request overrides of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from tokenwire.services.scripted_provider._errors import (
    InvalidOverrideError,
    InvalidSettingsError,
)

MAX_FRAGMENTS = 100_000
"""Upper bound of ``length``: a step never streams more fragments than this."""
MAX_FRAGMENT_SIZE = 4096
"""Upper bound of ``fragment_size`` (characters)."""
MAX_PART_CHARS = 4_000_000
"""Upper bound of ``length * fragment_size``: the characters of one text or reasoning part."""
MAX_STALL_S = 3600.0
"""Upper bound of ``stall_s``: a stalled stream always resumes (or is closed) within an hour."""


class ScriptedSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the scripted provider streams.

    - ``token_rate``: fragments per second; ``0`` streams as fast as the socket takes them.
    - ``fragment_size``: characters per text, reasoning and tool-argument fragment.
    - ``length``: fragments per text, reasoning or tool-argument part of a step.
    - ``stall_s``: how long the ``stall`` scenario stops mid-stream.
    - ``first_token_s``: how long a stream waits after its response headers before its first
      event, as a model's time to first token (``0``: at once).
    - ``seed``: mixed into every generated text and id.
    - ``sentinel``: every generated text, reasoning and tool arguments contain
      ``f"{sentinel}-{seed}"``, so a test can prove content never leaks into telemetry.
    - ``recording``: the file the ``recording`` scenario replays when no header names one.
    - ``recording_root``: the folder ``X-Scripted-Recording`` paths are resolved in; the header
      is refused while this is ``None`` (a network caller never picks an arbitrary file).

    Out-of-bounds values raise :class:`InvalidSettingsError` (``length`` up to
    :data:`MAX_FRAGMENTS`, ``fragment_size`` up to :data:`MAX_FRAGMENT_SIZE`, their product up
    to :data:`MAX_PART_CHARS`, ``stall_s`` and ``first_token_s`` up to :data:`MAX_STALL_S`).
    """

    token_rate: float = 0.0
    fragment_size: int = 4
    length: int = 8
    stall_s: float = 30.0
    first_token_s: float = 0.0
    seed: int = 0
    sentinel: str = "SENTINEL"
    recording: str | None = None
    recording_root: str | None = None

    def __post_init__(self) -> None:
        _check(
            "token_rate", self.token_rate, math.isfinite(self.token_rate) and self.token_rate >= 0
        )
        _check("fragment_size", self.fragment_size, 1 <= self.fragment_size <= MAX_FRAGMENT_SIZE)
        _check("length", self.length, 1 <= self.length <= MAX_FRAGMENTS)
        part = self.length * self.fragment_size
        _check("length * fragment_size", part, part <= MAX_PART_CHARS)
        _check("stall_s", self.stall_s, 0 <= self.stall_s <= MAX_STALL_S)
        _check("first_token_s", self.first_token_s, 0 <= self.first_token_s <= MAX_STALL_S)
        _check("sentinel", self.sentinel, bool(self.sentinel) and self.sentinel.isprintable())

    @property
    def sentinel_tag(self) -> str:
        """The string every generated content of this configuration contains."""
        return f"{self.sentinel}-{self.seed}"


def _check(name: str, value: object, ok: bool) -> None:
    if not ok:
        raise InvalidSettingsError(name, value, "out of bounds (see ScriptedSettings)")


OVERRIDE_HEADERS: Mapping[str, str] = {
    "x-scripted-rate": "rate",
    "x-scripted-fragments": "fragments",
    "x-scripted-fragment-size": "size",
    "x-scripted-stall": "stall",
    "x-scripted-first": "first",
    "x-scripted-seed": "seed",
}
"""Request headers that override a setting, by the option name they set."""

_OPTIONS: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "rate": ("token_rate", float),
    "fragments": ("length", int),
    "size": ("fragment_size", int),
    "stall": ("stall_s", float),
    "first": ("first_token_s", float),
    "seed": ("seed", int),
}


def header_options(headers: Mapping[str, str]) -> dict[str, str]:
    """The override options named by ``X-Scripted-*`` headers (case-insensitive)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    return {opt: lowered[h] for h, opt in OVERRIDE_HEADERS.items() if h in lowered}


def apply_overrides(settings: ScriptedSettings, options: Mapping[str, str]) -> ScriptedSettings:
    """``settings`` with the options (``rate``, ``fragments``, ``size``, ``stall``, ``first``,
    ``seed``) set.

    Raises :class:`InvalidOverrideError` for an unknown option or a bad value.
    """
    changes: dict[str, Any] = {}
    for name, raw in options.items():
        if name not in _OPTIONS:
            raise InvalidOverrideError(name, raw, f"unknown option; known: {sorted(_OPTIONS)}")
        field, parse = _OPTIONS[name]
        try:
            changes[field] = parse(raw.strip())
        except ValueError as exc:
            raise InvalidOverrideError(name, raw, f"not a {parse.__name__}") from exc
    try:
        return msgspec.structs.replace(settings, **changes)
    except InvalidSettingsError as exc:
        raise InvalidOverrideError(exc.name, str(exc.value), exc.reason) from exc
