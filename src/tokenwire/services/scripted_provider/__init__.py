"""The scripted provider: an offline upstream speaking OpenAI's and Anthropic's wire formats.

Scenarios (``text``, ``reasoning``, ``tools``, ``max-tokens``, ``error``, ``drop``,
``truncate``, ``stall``, ``http-429``, ``http-500``, ``recording``) are selected by the model
name; their content depends only on the scenario, the settings and the request, and
:func:`expected_outcome` computes the ground truth from the same script. See
docs/scripted-provider.md.
"""

from __future__ import annotations

from tokenwire.services.scripted_provider._app import ScriptedProvider, create_app
from tokenwire.services.scripted_provider._errors import (
    InvalidOverrideError,
    InvalidRequestBodyError,
    InvalidSettingsError,
    NoScriptError,
    RecordingUnavailableError,
    ScriptedProviderError,
    ScriptedRequestError,
    UnknownScenarioError,
)
from tokenwire.services.scripted_provider._expected import (
    ExpectedStep,
    FragmentCounts,
    expected_outcome,
)
from tokenwire.services.scripted_provider._request import Dialect
from tokenwire.services.scripted_provider._script import SCENARIOS, Scenario
from tokenwire.services.scripted_provider._server import (
    ScriptedServer,
    ServerStartError,
    run,
    serve,
)
from tokenwire.services.scripted_provider._settings import OVERRIDE_HEADERS, ScriptedSettings

__all__ = [
    "OVERRIDE_HEADERS",
    "SCENARIOS",
    "Dialect",
    "ExpectedStep",
    "FragmentCounts",
    "InvalidOverrideError",
    "InvalidRequestBodyError",
    "InvalidSettingsError",
    "NoScriptError",
    "RecordingUnavailableError",
    "Scenario",
    "ScriptedProvider",
    "ScriptedProviderError",
    "ScriptedRequestError",
    "ScriptedServer",
    "ScriptedSettings",
    "ServerStartError",
    "UnknownScenarioError",
    "create_app",
    "expected_outcome",
    "run",
    "serve",
]
