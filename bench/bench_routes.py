"""What routing costs a step's first byte (issue 45): a public name through a routes file
against ``provider/model`` without one, in the same run (``make bench BENCH=routes``).

One embedded broker, the scripted provider, and two gateway processes run as
``tokenwire gateway`` runs them (uvloop, httptools): the *plain* one has no routes file and is
asked for ``scripted/text``; the *routed* one has a routes file whose public name ``fast`` is a
group of two scripted deployments (weights 3 and 1, same upstream), so every request goes
through the plan (weighted order, health and capacity checks), the attempt wrapper and the
``routed`` field on the first chunk. A lone caller sends one request to each, then the next
pair, the order alternating (so neither side always follows the other), each on its own
keep-alive connection: time to first body bytes, per pair. Target: the routed side adds at
most 0.1 ms at p50 (the median of the pairs' differences).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from bench import _ab

PAIRS = 2000
OPTIONS = "fragments=2"
TARGET_MS = 0.1
FIGURES: dict[str, float] = {}

_ROUTES = """
[[models]]
name = "fast"
  [[models.deployments]]
  name = "scripted-a"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  weight = 3
  [[models.deployments]]
  name = "scripted-b"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  weight = 1
"""
_GATEWAY = """
import sys
from tokenwire.services.gateway import GatewaySettings, main
from tokenwire.services.gateway._routing.routes_file import load_routes
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
routes = load_routes(sys.argv[4], env) if len(sys.argv) > 4 else None
main(GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env,
                     routes=routes, routes_env=env))
"""


def _request(port: int, model: str, session: str) -> bytes:
    body = msgspec.json.encode(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\nx-tokenwire-session: {session}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _sides(tmp: Path, upstream: str) -> tuple[_ab.Side, _ab.Side]:
    routes = tmp / "routes.toml"
    routes.write_text(_ROUTES.format(options=OPTIONS, upstream=upstream))
    return (
        _ab.Side((), lambda port: _request(port, f"scripted/text?{OPTIONS}", "routes-plain")),
        _ab.Side((str(routes),), lambda port: _request(port, "fast", "routes-routed")),
    )


def main() -> str:
    """Run the pairs; the table (and ``FIGURES``)."""
    FIGURES.update(_ab.measure(_GATEWAY, _sides, n=PAIRS, seed=45, name="routed"))
    heads = ("provider/model, no routes file", "public name, routes file")
    return _ab.table(FIGURES, name="routed", heads=heads, target_ms=TARGET_MS)
