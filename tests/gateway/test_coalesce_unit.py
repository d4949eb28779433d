"""Coalesced reads' pieces (``_steps/coalesce.py``): the header and the setting (the held socket:
tests/providers/test_http_hold.py; the gateway: test_coalesce_real.py)."""

from __future__ import annotations

import pytest

from tokenwire.config import ConfigError
from tokenwire.services.gateway import GatewaySettings
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._steps.coalesce import COALESCE_HEADER, answered, coalesce_ms


@pytest.mark.parametrize(
    ("headers", "default", "expected"),
    [
        ({}, 0, 0),
        ({}, 150, 150),  # the deployment's default
        ({COALESCE_HEADER: "0"}, 150, 0),  # a request turns it off
        ({COALESCE_HEADER: "80"}, 0, 80),
        ({COALESCE_HEADER: " 1000 "}, 0, 1000),
    ],
)
def test_the_wait_is_the_requests_else_the_default(headers, default, expected):
    assert coalesce_ms(headers, default) == expected


@pytest.mark.parametrize("value", ["1001", "-1", "+5", "1.5", "1e2", "", "soon", "\u0661\u0660"])
def test_anything_but_a_whole_number_of_ms_up_to_a_second_is_a_400(value):
    with pytest.raises(InvalidRequestError) as raised:
        coalesce_ms({COALESCE_HEADER: value}, 0)
    assert raised.value.status == 400
    assert raised.value.param == COALESCE_HEADER
    assert repr(value) in raised.value.message


def test_the_answer_names_only_a_coalescing_that_was_applied():
    assert answered(0) == {}
    assert answered(250) == {COALESCE_HEADER: "250"}


def test_the_setting_is_bounded_like_the_header():
    assert GatewaySettings.from_env({"TOKENWIRE_GATEWAY_COALESCE_MS": "300"}).coalesce_ms == 300
    assert GatewaySettings.from_env({}).coalesce_ms == 0
    with pytest.raises(ConfigError, match="TOKENWIRE_GATEWAY_COALESCE_MS"):
        GatewaySettings.from_env({"TOKENWIRE_GATEWAY_COALESCE_MS": "1001"})
    with pytest.raises(ConfigError, match="TOKENWIRE_GATEWAY_COALESCE_MS"):
        GatewaySettings(coalesce_ms=-1)
