"""The committed JSON Schema files are exactly what the Structs generate.

On failure: ``.venv/bin/python -m tokenwire.schemas.jsonschema schemas/`` (``make schemas``),
then review and commit the diff.
"""

from __future__ import annotations

from pathlib import Path

from tokenwire.schemas import SCHEMA_VERSION
from tokenwire.schemas.jsonschema import render

COMMITTED = Path(__file__).resolve().parents[2] / "schemas"
CURRENT = COMMITTED / f"v{SCHEMA_VERSION}"


def test_committed_schema_files_match_the_structs() -> None:
    rendered = render()
    committed = {
        p.relative_to(COMMITTED).as_posix(): p.read_bytes() for p in CURRENT.rglob("*.json")
    }
    assert sorted(committed) == sorted(rendered)
    for name, body in rendered.items():
        assert committed[name] == body, f"schemas/{name} drifted: run make schemas"


def test_every_released_version_keeps_its_schema_files() -> None:
    """Other languages may pin an older version's files: they stay as released."""
    for version in range(1, SCHEMA_VERSION):
        released = COMMITTED / f"v{version}"
        assert sorted(p.name for p in released.glob("*.schema.json")), f"{released} is gone"
