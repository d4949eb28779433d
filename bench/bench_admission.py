"""What a key's limits and budget cost a step's first byte (issue 46): the same routed model
with a key that has limits and a budget against a key that has none, in the same run
(``make bench BENCH=admission``).

One embedded broker, the scripted provider, and two gateway processes run as ``tokenwire
gateway`` runs them (uvloop, httptools), both with the same routes file (a public name whose
one scripted deployment has a price, so that a budget can price it) and the same keys file:
the *plain* one is asked with a key without limits; the *limited* one with a key that has
requests and tokens per minute, concurrent streams and a daily budget, under a tenant that has
them too (eight admissions per call; the limits are high, so nothing is refused and the
leases stay in memory: the common case). A lone caller alternates pairs as ``bench_routes``
does. Target: limits add at most 0.2 ms at p50 (the median of the pairs' differences).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from bench import _ab

PAIRS = 2000
OPTIONS = "fragments=2"
TARGET_MS = 0.2
FIGURES: dict[str, float] = {}
PLAIN_KEY, LIMITED_KEY = "bench-plain-key", "bench-limited-key"

_ROUTES = """
[[models]]
name = "fast"
  [[models.deployments]]
  name = "scripted-priced"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  price = {{ input = 2.5, output = 10 }}
"""
_LIMITS = '{ rpm = 1000000, tpm = 1000000000, concurrent = 1000, budget = { usd = "1000000" } }'
_KEYS = """
[[keys]]
name = "plain"
sha256 = "{plain}"
[[keys]]
name = "limited"
sha256 = "{limited}"
tenant = "acme"
limits = {limits}
[[tenants]]
name = "acme"
limits = {limits}
"""
_GATEWAY = """
import sys
from tokenwire.services.gateway import GatewaySettings, main
from tokenwire.services.gateway._access.keys import load_keys_file
from tokenwire.services.gateway._routing.routes_file import load_routes
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
main(GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env,
                     routes=load_routes(sys.argv[4], env), routes_env=env,
                     named_keys=load_keys_file(sys.argv[5])))
"""


def _request(port: int, key: str, session: str) -> bytes:
    body = msgspec.json.encode(
        {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"authorization: Bearer {key}\r\n"
        f"content-type: application/json\r\nx-tokenwire-session: {session}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _files(tmp: Path, upstream: str) -> tuple[Path, Path]:
    routes, keys = tmp / "routes.toml", tmp / "keys.toml"
    routes.write_text(_ROUTES.format(options=OPTIONS, upstream=upstream))
    digests = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in
               (("plain", PLAIN_KEY), ("limited", LIMITED_KEY))}  # fmt: skip
    keys.write_text(_KEYS.format(limits=_LIMITS, **digests))
    return routes, keys


def _sides(tmp: Path, upstream: str) -> tuple[_ab.Side, _ab.Side]:
    files = tuple(str(f) for f in _files(tmp, upstream))
    return (
        _ab.Side(files, lambda port: _request(port, PLAIN_KEY, "admission-plain")),
        _ab.Side(files, lambda port: _request(port, LIMITED_KEY, "admission-limited")),
    )


def main() -> str:
    """Run the pairs; the table (and ``FIGURES``)."""
    FIGURES.update(_ab.measure(_GATEWAY, _sides, n=PAIRS, seed=46, name="limited"))
    heads = ("key without limits", "key and tenant with limits and budget")
    return _ab.table(FIGURES, name="limited", heads=heads, target_ms=TARGET_MS)
