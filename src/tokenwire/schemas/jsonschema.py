"""Generate the JSON Schema files of the wire contract for clients in other languages.

``python -m tokenwire.schemas.jsonschema schemas/`` writes one file per top-level type of the
current schema version under ``schemas/v<N>/``; a test fails when the committed files drift
from the Structs. The directories of earlier versions stay as they were released (version 1:
``schemas/v1/``, whose payloads every reader still decodes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from tokenwire.schemas import (
    SCHEMA_VERSION,
    ChunkEnvelope,
    ChunkFrame,
    SessionEvent,
    StepPersisted,
    StreamChunk,
    StreamStarted,
)

SCHEMA_TYPES: dict[str, object] = {
    "stream-chunk": StreamChunk,
    "chunk-envelope": ChunkEnvelope,
    "chunk-frame": ChunkFrame,
    "session-event": SessionEvent,
    "step-persisted": StepPersisted,
    "stream-started": StreamStarted,
}


def render() -> dict[str, bytes]:
    """Each schema file's name and its exact bytes (sorted keys, 2-space indent, newline)."""
    files: dict[str, bytes] = {}
    for name, tp in SCHEMA_TYPES.items():
        schema = msgspec.json.schema(tp)
        schema["$id"] = f"https://tokenwire.dev/schemas/v{SCHEMA_VERSION}/{name}.json"
        schema["title"] = f"tokenwire {name} (schema version {SCHEMA_VERSION})"
        body = msgspec.json.format(msgspec.json.encode(schema, order="sorted"), indent=2)
        files[f"v{SCHEMA_VERSION}/{name}.schema.json"] = body + b"\n"
    return files


def main(argv: list[str]) -> int:
    """Write every schema file under the directory named by ``argv[0]``."""
    out = Path(argv[0] if argv else "schemas")
    for rel, body in render().items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
