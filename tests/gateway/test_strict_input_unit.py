"""Strict input as units: loopback ``Host`` names, ``Origin``, the JSON content type, and
repeated JSON names (the standard library's parser, with a hook that sees every pair, is the
oracle of the latter)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.services.gateway._access.browsers import (
    keyless_refusal,
    loopback_host,
    require_json,
)
from tokenwire.services.gateway._dialects.validate import decode_object
from tokenwire.services.gateway._errors import (
    ForbiddenError,
    InvalidRequestError,
    UnsupportedMediaTypeError,
)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.1:8080", True),
        ("127.9.9.9:1", True),
        ("localhost", True),
        ("LOCALHOST:8080", True),
        ("[::1]", True),
        ("[::1]:8080", True),
        ("localhost.", False),
        ("localhost.evil.example", False),
        ("evil.example", False),
        ("127.0.0.1.nip.io:8080", False),
        ("0.0.0.0:8080", False),
        ("10.0.0.1", False),
        ("[::ffff:127.0.0.1]:80", False),
        ("127.0.0.1:80x", False),
        ("", False),
        ("[::1", False),
        ("::1", False),
    ],
)
def test_loopback_host_names(host: str, loopback: bool) -> None:
    assert loopback_host(host) is loopback


def headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in values.items()]


def test_a_keyless_request_needs_a_loopback_host_and_its_own_origin() -> None:
    assert keyless_refusal(headers(host="127.0.0.1:8080")) is None
    assert keyless_refusal(headers(host="127.0.0.1:8080", origin="http://127.0.0.1:8080")) is None
    assert keyless_refusal(headers(host="LOCALHOST:1", origin="http://localhost:1")) is None
    for refused in (
        headers(),
        headers(host="evil.example:8080"),
        headers(host="127.0.0.1:8080", origin="http://evil.example"),
        headers(host="127.0.0.1:8080", origin="null"),
        headers(host="127.0.0.1:8080", origin="http://127.0.0.1:9999"),
        headers(host="127.0.0.1:8080", origin="https://127.0.0.1:8080"),
        headers(host="127.0.0.1:8080", origin="http://localhost:8080"),
    ):
        assert isinstance(keyless_refusal(refused), ForbiddenError), refused
    # the first of a repeated header counts (as the rest of the gateway reads them)
    twice = headers(host="evil.example") + headers(host="127.0.0.1")
    assert keyless_refusal(twice) is not None


@pytest.mark.parametrize(
    ("declared", "accepted"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        (" application/json ;x=y", True),
        ("text/plain", False),
        ("text/plain; charset=utf-8", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data", False),
        ("application/jsonx", False),
        ("application/vnd.api+json", False),
        ("", False),
    ],
)
def test_model_routes_take_only_json(declared: str, accepted: bool) -> None:
    given_headers = {"content-type": declared} if declared else {}
    if accepted:
        require_json(given_headers)
    else:
        with pytest.raises(UnsupportedMediaTypeError) as raised:
            require_json(given_headers)
        assert raised.value.status == 415
        assert raised.value.param == "content-type"


# -- repeated names ---------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "model", "x:y", "k\\u003a", "c\\u003Ad", 'q\\"', "\\\\"])
TEXTS = st.sampled_from(["v", "p:q", "\\u003a", "a\\u003Ab", "\\\\u003a", '\\":', "::", ""])


def _object(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A JSON object's text whose members may repeat a name (spelled as it is, or escaped)."""
    member = st.tuples(NAMES, children).map(lambda m: f'"{m[0]}" : {m[1]}')
    return st.lists(member, max_size=4).map(lambda ms: "{" + ", ".join(ms) + "}")


VALUES = st.recursive(
    st.one_of(TEXTS.map(lambda t: f'"{t}"'), st.integers(-5, 5).map(str), st.just("null")),
    lambda inner: st.one_of(
        _object(inner), st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    ),
    max_leaves=12,
)


def _repeats(text: str) -> bool:
    """The oracle: whether any object of ``text`` repeats a name (after unescaping)."""
    found = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or len({k for k, _ in pairs}) != len(pairs)
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return found


@settings(max_examples=400, deadline=None)
@given(_object(VALUES))
def test_a_repeated_name_anywhere_is_refused_and_nothing_else_is(text: str) -> None:
    body = text.encode()
    if _repeats(text):
        with pytest.raises(InvalidRequestError, match="appears twice"):
            decode_object(body)
    else:
        assert decode_object(body).value == json.loads(text)


def test_a_repeated_name_hidden_by_an_escaped_colon_is_found() -> None:
    """A dropped member's colons can be made up by a kept string's ``\\u003a``: the count
    alone would balance, so an escaped colon sends the body to the exact check."""
    body = b'{"model": "x", "model": "a\\u003ab"}'
    with pytest.raises(InvalidRequestError) as raised:
        decode_object(body)
    assert raised.value.param == "model"
