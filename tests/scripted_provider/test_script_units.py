"""Unit tests of the pure parts: settings, overrides, model names, scripts, expectations."""

from __future__ import annotations

import json
from typing import Any

import pytest

import tokenwire.services.scripted_provider as sp
from tokenwire.services.scripted_provider import (
    InvalidOverrideError,
    InvalidSettingsError,
    NoScriptError,
    ScriptedSettings,
    UnknownScenarioError,
    expected_outcome,
)
from tokenwire.services.scripted_provider._request import parse_model
from tokenwire.services.scripted_provider._settings import apply_overrides, header_options

USER = [{"role": "user", "content": "hi"}]
BODY = {"model": "scripted/x", "messages": USER}


def test_public_names_are_exported_once() -> None:
    assert len(set(sp.__all__)) == len(sp.__all__)
    assert all(hasattr(sp, name) for name in sp.__all__)


@pytest.mark.parametrize(
    "kwargs",
    [{"length": 0}, {"fragment_size": 0}, {"token_rate": -1.0}, {"stall_s": 1e9}, {"sentinel": ""}],
)
def test_out_of_bounds_settings_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingsError):
        ScriptedSettings(**kwargs)


def test_headers_and_model_options_override_settings() -> None:
    options = header_options(
        {"X-Scripted-Rate": "50", "x-scripted-fragments": "2000", "Other": "1"}
    )
    assert options == {"rate": "50", "fragments": "2000"}
    changed = apply_overrides(
        ScriptedSettings(), {**options, "size": "1", "stall": "0.5", "seed": "3"}
    )
    assert (changed.token_rate, changed.length, changed.fragment_size) == (50.0, 2000, 1)
    assert (changed.stall_s, changed.seed) == (0.5, 3)


def test_first_token_delay_is_an_option_and_a_header_within_bounds() -> None:
    assert header_options({"X-Scripted-First": "0.25"}) == {"first": "0.25"}
    assert apply_overrides(ScriptedSettings(), {"first": "0.25"}).first_token_s == 0.25
    for bad in ("-1", "3601", "soon"):
        with pytest.raises(InvalidOverrideError):
            apply_overrides(ScriptedSettings(), {"first": bad})


def test_bad_override_names_the_option() -> None:
    with pytest.raises(InvalidOverrideError) as info:
        apply_overrides(ScriptedSettings(), {"fragments": "100001"})
    assert info.value.name == "length"


def test_model_names_with_and_without_prefix() -> None:
    assert parse_model("tools") == ("tools", {})
    assert parse_model("scripted/tools") == ("tools", {})
    assert parse_model("scripted/text?fragments=3&rate=0") == (
        "text",
        {"fragments": "3", "rate": "0"},
    )


def test_text_has_exactly_length_fragments_of_the_fragment_size() -> None:
    settings = ScriptedSettings(length=50, fragment_size=3)
    step = expected_outcome("text", BODY, settings)
    assert step.fragments.text == 50
    assert len(step.text) == 150
    assert step.message is not None
    assert step.message.finish_reason == "stop"


def test_sentinel_longer_than_the_whole_text_still_fits() -> None:
    step = expected_outcome("text", BODY, ScriptedSettings(length=1, fragment_size=1, seed=123))
    assert step.text == "SENTINEL-123"


def test_tools_arguments_are_json_objects_and_ids_differ_by_dialect() -> None:
    openai_step = expected_outcome("tools", BODY, ScriptedSettings())
    anthropic_step = expected_outcome("tools", BODY, ScriptedSettings(), dialect="anthropic")
    assert openai_step.finish_reason == "tool-calls"
    assert [c.name for c in openai_step.tool_calls] == ["get_weather", "get_time"]
    assert all(isinstance(json.loads(c.arguments), dict) for c in openai_step.tool_calls)
    assert all(c.id.startswith("call_") for c in openai_step.tool_calls)
    assert all(c.id.startswith("toolu_") for c in anthropic_step.tool_calls)
    assert openai_step.fragments.tool_arguments >= 2 * ScriptedSettings().length


@pytest.mark.parametrize("size", [1, 4, 4096])
def test_max_tokens_cuts_the_tool_call_inside_its_arguments(size: int) -> None:
    step = expected_outcome("max-tokens", BODY, ScriptedSettings(fragment_size=size))
    assert step.finish_reason == "max-tokens"
    assert step.tool_calls == []
    (cut,) = step.dropped_tool_calls
    assert cut.arguments.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.arguments)
    assert step.message is not None
    assert step.message.dropped_tool_calls == [cut]


def test_failed_steps_have_a_provider_error_and_no_message() -> None:
    for scenario in ("error", "drop", "truncate", "http-429", "http-500"):
        step = expected_outcome(scenario, BODY, ScriptedSettings(), dialect="anthropic")
        assert step.failed
        assert step.error is not None
        assert step.error.kind == "provider"
        assert step.message is None
        assert step.usage is None
    error = expected_outcome("http-429", BODY, ScriptedSettings()).error
    assert error is not None
    assert error.code == "rate_limit_exceeded"


def test_recording_and_unknown_scenarios_have_no_outcome() -> None:
    with pytest.raises(NoScriptError):
        expected_outcome("recording", BODY, ScriptedSettings())
    with pytest.raises(UnknownScenarioError):
        expected_outcome("nope", BODY, ScriptedSettings())


def test_request_may_be_raw_json() -> None:
    raw = json.dumps(BODY).encode()
    assert expected_outcome("text", raw, ScriptedSettings()) == expected_outcome(
        "text", BODY, ScriptedSettings()
    )


async def test_pacer_keeps_a_schedule_of_one_interval_per_send() -> None:
    from tokenwire.services.scripted_provider._player import Pacer

    clock = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    pacer = Pacer(4.0, now=lambda: clock[0], sleep=sleep)
    await pacer.wait()  # the first send goes at once
    await pacer.wait()
    clock[0] += 0.1  # a slow send: the next wait is shorter, no drift
    await pacer.wait()
    pacer.restart()
    await pacer.wait()
    assert slept == [0.25, pytest.approx(0.15)]
    await Pacer(0.0, now=lambda: 0.0, sleep=sleep).wait()
    assert len(slept) == 2
