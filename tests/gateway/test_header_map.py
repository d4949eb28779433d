"""header_map (``_api/edge.py``): a request's headers read once, as Starlette's ``Headers`` reads
them (the oracle here), for the names a model call looks up."""

from __future__ import annotations

from starlette.datastructures import Headers

from tokenwire.services.gateway._api.edge import header_map

RAW = [
    (b"host", b"127.0.0.1:8080"),
    (b"authorization", b"Bearer first"),
    (b"x-tokenwire-session", b"s-1"),
    (b"authorization", b"Bearer second"),
    (b"x-custom", b"caf\xe9"),
]


def test_every_name_reads_as_starlette_reads_it() -> None:
    mapped = header_map({"type": "http", "headers": RAW})
    oracle = Headers(raw=RAW)
    for name in ("host", "authorization", "x-tokenwire-session", "x-custom", "openai-beta"):
        assert mapped.get(name) == oracle.get(name), name
    assert mapped["authorization"] == "Bearer first"  # the first of a repeated name
    assert set(mapped) == {"host", "authorization", "x-tokenwire-session", "x-custom"}


def test_no_headers_is_an_empty_map() -> None:
    assert header_map({"type": "http", "headers": []}) == {}
