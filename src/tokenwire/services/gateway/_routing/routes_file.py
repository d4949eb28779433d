"""The routes file: public model names, each a group of deployments with its fallbacks
(``TOKENWIRE_ROUTES_FILE``, TOML; the format and its checks: docs/gateway.md, "Routes",
and deploy/routes.example.toml).

:func:`load_routes` reads and checks the whole file (the shape, names, providers, base URLs,
credential variables, prices, fallbacks, one dialect per model) and raises
:class:`RoutesFileError` naming the entry (``$.models[0].deployments[1].weight: ...``); the
gateway then does not start (exit 2), and a reload that fails keeps the routes in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from tokenwire import variables
from tokenwire.config import ConfigError
from tokenwire.providers import (
    Dialect,
    ProviderConfigError,
    UnknownProviderError,
    check_header,
    check_url,
    get_provider,
)
from tokenwire.schemas import DeploymentPrice

ROUTES_FILE_VAR = variables.ROUTES_FILE.env
SCRIPTED = "scripted"
_MAX_FILE_BYTES = 1024 * 1024
_PUBLIC_NAME = r"^[^\s]{1,256}$"
_DEPLOYMENT_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_PICO_PER_MILLION = Decimal(10**6)

Strategy = Literal["weighted", "least-in-flight"]


class RoutesFileError(ConfigError):
    """The routes file cannot be used: ``where`` names the entry (``$.models[1].name``), ``why``
    what is wrong with it. Never carries a credential."""

    def __init__(self, path: str, where: str, why: str) -> None:
        super().__init__(ROUTES_FILE_VAR, path, f"{where}: {why}" if where else why)
        self.path = path
        self.where = where


# -- the file's shape -----------------------------------------------------------------------


class _Price(msgspec.Struct, forbid_unknown_fields=True):
    input: Annotated[float, msgspec.Meta(ge=0)]
    output: Annotated[float, msgspec.Meta(ge=0)]
    cache_read: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cache_write: Annotated[float, msgspec.Meta(ge=0)] | None = None


class _Deployment(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(pattern=_DEPLOYMENT_NAME)]
    provider: str
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    base_url: str | None = None
    api_key_env: Annotated[str, msgspec.Meta(pattern=_ENV_NAME)] | None = None
    weight: Annotated[float, msgspec.Meta(gt=0, le=1_000_000)] = 1.0
    rpm: Annotated[int, msgspec.Meta(gt=0)] | None = None
    tpm: Annotated[int, msgspec.Meta(gt=0)] | None = None
    price: _Price | None = None


class _Policy(msgspec.Struct, forbid_unknown_fields=True):
    strategy: Strategy | None = None
    first_byte_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None
    failures: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    window_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] | None = None
    cooldown_s: Annotated[float, msgspec.Meta(ge=1, le=86400)] | None = None
    max_cooldown_s: Annotated[float, msgspec.Meta(ge=1, le=86400)] | None = None


class _Model(_Policy, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(pattern=_PUBLIC_NAME)] = ""
    deployments: list[_Deployment] = []
    fallbacks: list[str] = []


class _File(msgspec.Struct, forbid_unknown_fields=True):
    models: list[_Model] = []
    defaults: _Policy = msgspec.field(default_factory=_Policy)


# -- what the gateway routes with -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When a group's deployments are given up on, and for how long (docs/gateway.md)."""

    first_byte_timeout_s: float = 30.0
    failures: int = 3
    window_s: float = 30.0
    cooldown_s: float = 30.0
    max_cooldown_s: float = 300.0


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """One deployment: where it is (provider, upstream model, base URL), its credential (read
    from ``api_key_env`` at load, kept out of ``repr``), its weight, capacity and price."""

    name: str
    provider: str
    model: str
    base_url: str | None
    api_key_env: str | None
    api_key: str | None
    weight: float
    rpm: int | None
    tpm: int | None
    price: DeploymentPrice | None

    def __repr__(self) -> str:  # the credential never shows
        return f"DeploymentSpec(name={self.name!r}, provider={self.provider!r})"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A public model name: its deployments, its declared fallbacks, how it balances and its
    health policy."""

    name: str
    deployments: tuple[DeploymentSpec, ...]
    fallbacks: tuple[str, ...]
    strategy: Strategy
    health: HealthPolicy


@dataclass(frozen=True, slots=True)
class RoutesConfig:
    """A routes file, checked: its groups by public name."""

    path: str
    groups: Mapping[str, GroupSpec]

    @property
    def deployments(self) -> tuple[DeploymentSpec, ...]:
        """Every deployment of every group, in file order."""
        return tuple(d for g in self.groups.values() for d in g.deployments)

    def secrets(self) -> tuple[str, ...]:
        """The credential values the deployments send (scrubbed from every report)."""
        return tuple(d.api_key for d in self.deployments if d.api_key)


def load_routes(path: str, env: Mapping[str, str]) -> RoutesConfig:
    """Read and check the routes file at ``path`` (credentials from ``env``)."""
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RoutesFileError(path, "", f"cannot read it: {exc.strerror}") from None
    if len(data) > _MAX_FILE_BYTES:
        raise RoutesFileError(path, "", f"larger than {_MAX_FILE_BYTES} bytes")
    return parse_routes(data, env, path)


def parse_routes(data: bytes, env: Mapping[str, str], path: str = "<routes>") -> RoutesConfig:
    """The checked routes of a routes file's bytes; :class:`RoutesFileError` naming the entry."""
    try:
        parsed = msgspec.toml.decode(data, type=_File)
    except msgspec.ValidationError as exc:
        where, _, why = _split_validation(str(exc))
        raise RoutesFileError(path, where, why) from None
    except msgspec.DecodeError as exc:
        raise RoutesFileError(path, "", f"not a TOML file: {exc}") from None
    return _Checker(path, env, parsed.defaults).config(parsed.models)


def _split_validation(text: str) -> tuple[str, str, str]:
    """msgspec's ``... - at `$.models[0].name``` as (where, '', what)."""
    what, sep, where = text.rpartition(" - at `")
    if not sep:
        return "", "", text
    if "matching regex" in what:
        what = "malformed (" + _PATTERN_HELP + ")"
    return where.rstrip("`"), "", what


_PATTERN_HELP = (
    "a public name: 1-256 characters without spaces; a deployment name: 1-64 letters, digits, "
    "'_', '-'; api_key_env: a variable name"
)


class _Checker:
    """Checks the decoded file entry by entry (each error names its entry)."""

    def __init__(self, path: str, env: Mapping[str, str], defaults: _Policy) -> None:
        self.path = path
        self.env = env
        self.defaults = defaults
        self.deployment_names: set[str] = set()

    def fail(self, where: str, why: str) -> RoutesFileError:
        return RoutesFileError(self.path, where, why)

    def config(self, models: list[_Model]) -> RoutesConfig:
        groups: dict[str, GroupSpec] = {}
        for i, model in enumerate(models):
            where = f"$.models[{i}]"
            if not model.name:
                raise self.fail(f"{where}.name", "required")
            if model.name in groups:
                raise self.fail(f"{where}.name", f"{model.name!r} is named twice")
            groups[model.name] = self.group(model, where)
        for i, model in enumerate(models):
            self.check_fallbacks(model, groups, f"$.models[{i}].fallbacks")
        return RoutesConfig(self.path, groups)

    def group(self, model: _Model, where: str) -> GroupSpec:
        if not model.deployments:
            raise self.fail(f"{where}.deployments", "a model needs at least one deployment")
        deployments = tuple(
            self.deployment(d, f"{where}.deployments[{j}]") for j, d in enumerate(model.deployments)
        )
        dialects = {_dialect(d.provider) for d in deployments}
        if len(dialects) > 1:
            shown = ", ".join(sorted(str(d) for d in dialects))
            raise self.fail(
                f"{where}.deployments",
                f"one model's deployments speak one dialect (found {shown}); put the others "
                "in a model of their own and name it in fallbacks",
            )
        return GroupSpec(
            model.name,
            deployments,
            tuple(model.fallbacks),
            model.strategy or self.defaults.strategy or "weighted",
            self.health(model, where),
        )

    def health(self, model: _Model, where: str) -> HealthPolicy:
        base, d = HealthPolicy(), self.defaults
        policy = HealthPolicy(
            first_byte_timeout_s=_first(
                model.first_byte_timeout_s, d.first_byte_timeout_s, base.first_byte_timeout_s
            ),
            failures=_first(model.failures, d.failures, base.failures),
            window_s=_first(model.window_s, d.window_s, base.window_s),
            cooldown_s=_first(model.cooldown_s, d.cooldown_s, base.cooldown_s),
            max_cooldown_s=_first(model.max_cooldown_s, d.max_cooldown_s, base.max_cooldown_s),
        )
        if policy.max_cooldown_s < policy.cooldown_s:
            raise self.fail(f"{where}.max_cooldown_s", "must be at least cooldown_s")
        return policy

    def deployment(self, d: _Deployment, where: str) -> DeploymentSpec:
        if d.name in self.deployment_names:
            raise self.fail(f"{where}.name", f"the deployment name {d.name!r} is used twice")
        self.deployment_names.add(d.name)
        self.provider(d, where)
        if d.base_url is not None:
            try:
                check_url(d.base_url)
            except ValueError as exc:
                raise self.fail(f"{where}.base_url", str(exc)) from None
        return DeploymentSpec(
            name=d.name,
            provider=d.provider,
            model=d.model,
            base_url=d.base_url,
            api_key_env=d.api_key_env,
            api_key=self.credential(d, where),
            weight=d.weight,
            rpm=d.rpm,
            tpm=d.tpm,
            price=self.price(d.price, f"{where}.price"),
        )

    def provider(self, d: _Deployment, where: str) -> None:
        if d.provider == SCRIPTED:
            if d.base_url is None:
                raise self.fail(f"{where}.base_url", "the scripted provider has no default")
            return
        try:
            spec = get_provider(d.provider)
        except UnknownProviderError as exc:
            raise self.fail(f"{where}.provider", str(exc)) from None
        if d.base_url is None:
            try:
                spec.base_url({})
            except ProviderConfigError:
                raise self.fail(f"{where}.base_url", f"{d.provider} has no default") from None

    def credential(self, d: _Deployment, where: str) -> str | None:
        name = d.api_key_env
        if name is None and d.provider != SCRIPTED:
            name = get_provider(d.provider).api_key_env
            if name is None or not self.env.get(name):
                return None  # as for provider/model: no credential header
        if name is None:
            return None
        value = self.env.get(name)
        if not value:
            raise self.fail(f"{where}.api_key_env", f"the variable {name} is not set")
        try:
            check_header("authorization", value)
        except ValueError:
            why = f"the value of {name} cannot be sent in a request header"
            raise self.fail(f"{where}.api_key_env", why) from None
        return value

    def price(self, price: _Price | None, where: str) -> DeploymentPrice | None:
        if price is None:
            return None
        return DeploymentPrice(
            input_pusd=self.pusd(price.input, f"{where}.input"),
            output_pusd=self.pusd(price.output, f"{where}.output"),
            cache_read_pusd=self.optional_pusd(price.cache_read, f"{where}.cache_read"),
            cache_write_pusd=self.optional_pusd(price.cache_write, f"{where}.cache_write"),
        )

    def optional_pusd(self, usd_per_million: float | None, where: str) -> int | None:
        return None if usd_per_million is None else self.pusd(usd_per_million, where)

    def pusd(self, usd_per_million: float, where: str) -> int:
        """USD per million tokens as exact pico-USD per token (at most six decimals)."""
        try:
            exact = Decimal(repr(usd_per_million)) * _PICO_PER_MILLION
        except InvalidOperation:
            raise self.fail(where, "not a price") from None
        if exact != exact.to_integral_value():
            raise self.fail(where, "at most six decimals (USD per million tokens)")
        return int(exact)

    def check_fallbacks(self, model: _Model, groups: Mapping[str, GroupSpec], where: str) -> None:
        for k, name in enumerate(model.fallbacks):
            if name == model.name:
                raise self.fail(f"{where}[{k}]", "a model is not its own fallback")
            if name not in groups:
                raise self.fail(f"{where}[{k}]", f"{name!r} is not a model of this file")
            if model.fallbacks.index(name) != k:
                raise self.fail(f"{where}[{k}]", f"{name!r} is named twice")


_N = TypeVar("_N", int, float)


def _first(group: _N | None, defaults: _N | None, builtin: _N) -> _N:
    """The group's own value, else the file's default, else the built-in one."""
    if group is not None:
        return group
    return defaults if defaults is not None else builtin


def _dialect(provider: str) -> Dialect | str:
    """A deployment's dialect; the scripted provider's follows the caller's."""
    return "the caller's (scripted)" if provider == SCRIPTED else get_provider(provider).dialect
