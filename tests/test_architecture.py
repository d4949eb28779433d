"""Dependencies point one way (PRINCIPLES.md, 2): a test fails when an arrow points back."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenwire"

# Which tokenwire packages each layer may import (besides itself). Services may import every
# library layer but never another service; only the CLI sees everything.
LIBRARIES = {
    "schemas",
    "fold",
    "sse",
    "providers",
    "broker",
    "store",
    "ledger",
    "config",
    "scrub",
    "variables",
    "leftovers",
}
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "fold": {"schemas"},
    "sse": set(),
    "variables": set(),
    "config": {"variables"},
    "scrub": set(),
    "leftovers": set(),
    "providers": {"schemas", "sse", "scrub"},
    "broker": {"schemas", "config", "scrub", "variables"},
    "ledger": {"schemas"},
    "store": {"schemas", "ledger", "scrub"},
    "replay": {"schemas", "fold", "broker", "store", "ledger", "config", "scrub", "variables"},
    "observability": {"schemas"},
}
# Third-party packages a layer may import; the wire contract stays importable from anywhere.
THIRD_PARTY: dict[str, set[str]] = {"schemas": {"msgspec"}, "fold": {"msgspec"}}
# Third-party packages only one layer may import: the broker boundary is closed (issue 13).
# The price library is the ledger's (ADR 0028): one place prices, every other layer asks it.
OWNED_BY: dict[str, str] = {"nats": "broker", "genai_prices": "ledger"}


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[1] == "services":
        return f"services.{parts[2]}" if len(parts) > 2 else "services"
    return parts[1].removesuffix(".py")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if len(parts) > 1:
            out.append((".".join(parts), path))
    return out


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(module: str, imports: set[str]) -> list[str]:
    layer = _layer(module)
    return [name for name in imports if not _allowed(layer, name)]


def _allowed(layer: str, name: str) -> bool:
    """May a module of ``layer`` import ``name``?"""
    top = name.split(".", maxsplit=1)[0]
    if top in OWNED_BY:
        return layer == OWNED_BY[top]
    if top == "tokenwire" and "." in name:
        target = _layer(name)
        if layer in (target, "cli"):
            return True
        if layer.startswith("services"):
            return not (target.startswith("services") or target == "cli")
        return layer not in ALLOWED or target in ALLOWED[layer]
    if layer in THIRD_PARTY and top not in sys.stdlib_module_names:
        return top in THIRD_PARTY[layer] | {"tokenwire", "__future__"}
    return True


@pytest.mark.parametrize(("module", "path"), _modules(), ids=str)
def test_imports_point_one_way(module: str, path: Path) -> None:
    assert _violations(module, _imports(path)) == [], f"{module} imports against the layering"


def test_the_checker_catches_a_back_arrow() -> None:
    assert _violations("tokenwire.schemas._chunks", {"tokenwire.fold"}) == ["tokenwire.fold"]
    assert _violations("tokenwire.schemas._chunks", {"httpx"}) == ["httpx"]
    assert _violations("tokenwire.services.gateway._api.app", {"tokenwire.services.assembler"}) == [
        "tokenwire.services.assembler"
    ]
    assert _violations("tokenwire.cli._app", {"tokenwire.services.gateway"}) == []


def test_the_checker_keeps_nats_behind_the_broker() -> None:
    assert _violations("tokenwire.services.assembler._service", {"nats.aio.client"}) == [
        "nats.aio.client"
    ]
    assert _violations("tokenwire.services.telemetry._service", {"nats"}) == ["nats"]
    assert _violations("tokenwire.cli._status", {"nats.errors"}) == ["nats.errors"]
    assert _violations("tokenwire.replay._source", {"nats.js"}) == ["nats.js"]
    assert _violations("tokenwire.broker._consumer", {"nats.aio.client"}) == []


# The gateway's rooms, top to bottom (services/gateway/__init__.py): a room imports its own
# modules and the rooms below it, never one above; every room may import the exception tree.
GATEWAY = "tokenwire.services.gateway"
GATEWAY_ROOMS = (
    "_api",
    "_steps",
    "_limits",
    "_resume",
    "_access",
    "_observe",
    "_output",
    "_routing",
    "_dialects",
)
GATEWAY_FLOOR = "_errors"


def _room(module: str) -> str | None:
    """The gateway room of ``module`` (``_errors`` for the floor), None outside the gateway or
    for the package itself."""
    if not module.startswith(GATEWAY + "."):
        return None
    return module[len(GATEWAY) + 1 :].split(".", maxsplit=1)[0]


def _room_violations(module: str, imports: set[str]) -> list[str]:
    """The imports of gateway modules that point at ``module``'s room's superiors (or at the
    package's own ``__init__``, which sits above every room)."""
    room = _room(module)
    if room is None:
        return []
    below = set(GATEWAY_ROOMS[GATEWAY_ROOMS.index(room) :]) if room in GATEWAY_ROOMS else set()
    return sorted(
        name
        for name in imports
        if (name == GATEWAY or name.startswith(GATEWAY + "."))
        and _room(name) not in below | {GATEWAY_FLOOR}
    )


def test_the_gateway_lives_in_its_rooms() -> None:
    """Every gateway module is in a room, or is the package or its exception tree: a new
    module is placed, not dropped beside thirty others."""
    loose = [m for m, _ in _modules() if _room(m) not in {*GATEWAY_ROOMS, GATEWAY_FLOOR, None}]
    assert loose == []


@pytest.mark.parametrize(
    ("module", "path"), [(m, p) for m, p in _modules() if _room(m) is not None], ids=str
)
def test_gateway_rooms_point_down(module: str, path: Path) -> None:
    assert _room_violations(module, _imports(path)) == [], f"{module} imports a room above it"


def test_the_room_checker_catches_an_arrow_up() -> None:
    step, app = f"{GATEWAY}._steps.step", f"{GATEWAY}._api.app"
    assert _room_violations(step, {app}) == [app]
    assert _room_violations(step, {GATEWAY}) == [GATEWAY]
    assert _room_violations(f"{GATEWAY}._errors", {step}) == [step]
    assert _room_violations(app, {step, f"{GATEWAY}._errors", f"{GATEWAY}._dialects"}) == []


def _targets(path: Path, known: set[str]) -> set[str]:
    """The tokenwire modules ``path`` imports: ``from pkg import sub`` imports ``pkg.sub`` when
    that is a module (its package's ``__init__`` runs first for every import, not an arrow)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out |= subs or ({node.module} & known)
    return out


def _graph(prefix: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, among the modules whose name starts with ``prefix``."""
    known = {m for m, _ in _modules()}
    return {
        m: {name for name in _targets(p, known) if name.startswith(prefix)} - {m}
        for m, p in _modules()
        if m.startswith(prefix)
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle of ``graph`` once, as the path that closes it (depth-first)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No import circles anywhere in tokenwire (type-only imports count too)."""
    assert _cycles(_graph("tokenwire.")) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _packages_with_all() -> list[str]:
    return [m for m, p in _modules() if p.name == "__init__.py" and "__all__" in p.read_text()]


@pytest.mark.parametrize("package", _packages_with_all())
def test_public_surface_is_listed_once(package: str) -> None:
    """httpx's form: ``__all__`` is exactly the package's public names, each once (ruff keeps
    it sorted); a name may resolve lazily (``store.PostgresStore``, imported on first use). A
    private package (``_dialects``) only has to list what it defines."""
    mod = importlib.import_module(package)
    listed = set(mod.__all__)
    assert len(mod.__all__) == len(listed), "duplicate names in __all__"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == [], f"{package}.__all__ names what does not exist: {missing}"
    public = {
        n for n, v in vars(mod).items() if not n.startswith("_") and not isinstance(v, ModuleType)
    } - {"annotations"}  # a submodule imported elsewhere becomes an attribute: not a name
    if any(part.startswith("_") for part in package.split(".")):
        public = {n for n in public if getattr(vars(mod)[n], "__module__", "").startswith(package)}
    assert public - listed == set(), f"public names missing from {package}.__all__"


MAX_MODULE_LINES = 800
"""Past this a module becomes a package of private files (PRINCIPLES.md, 1)."""


def test_no_module_passes_800_lines() -> None:
    """The source, the tests and the benchmarks alike."""
    root = SRC.parents[1]
    paths = [p for d in ("src", "tests", "bench") for p in (root / d).rglob("*.py")]
    lines = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in paths}
    assert {m: n for m, n in lines.items() if n > MAX_MODULE_LINES} == {}


def _layout_table() -> dict[str, set[str]]:
    """docs/architecture.md's package table: package -> the tokenwire packages it may import."""
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    table = text.split("## Package layout", 1)[1].split("\n\n", 2)[1]
    out: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].strip("`").removeprefix("tokenwire.")
        out[name] = {w for w in re.split(r"[\s,]+", cells[2]) if w in ALLOWED}
    return out


def test_the_docs_package_table_is_the_layering() -> None:
    """docs/architecture.md names every package, and what each may import is what the test
    allows: the table is the code's, not a drawing of it."""
    table = _layout_table()
    tops = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    tops -= {"__init__", "__main__"}
    assert tops - {"services"} <= set(table)
    assert {name: table[name] for name in ALLOWED} == ALLOWED
