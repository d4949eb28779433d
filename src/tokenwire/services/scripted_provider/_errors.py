"""The scripted provider's exception tree.

```
ScriptedProviderError
├── ScriptedRequestError          the caller's request cannot be served (answered 4xx)
│   ├── InvalidRequestBodyError   the body is not the JSON object the endpoint expects
│   ├── UnknownScenarioError      the model names no scenario
│   ├── InvalidOverrideError      a per-request override (header or model option) is invalid
│   └── RecordingUnavailableError the recording to replay cannot be read or is not allowed
├── InvalidSettingsError          a ScriptedSettings field is out of its bounds
└── NoScriptError                 the scenario has no script to compute an outcome from
```
"""

from __future__ import annotations


class ScriptedProviderError(Exception):
    """Base of every error the scripted provider raises."""


class ScriptedRequestError(ScriptedProviderError):
    """The caller's request cannot be served; the app answers it with ``status``."""

    status: int = 400


class InvalidRequestBodyError(ScriptedRequestError):
    """The request body is not a JSON object with a string ``model``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid request body: {reason}")
        self.reason = reason


class UnknownScenarioError(ScriptedRequestError):
    """The model names no scenario (answered 404, like an unknown model)."""

    status = 404

    def __init__(self, scenario: str) -> None:
        super().__init__(f"unknown scripted scenario {scenario!r}")
        self.scenario = scenario


class InvalidOverrideError(ScriptedRequestError):
    """A per-request override (``X-Scripted-*`` header or model option) is invalid."""

    def __init__(self, name: str, value: str, reason: str) -> None:
        super().__init__(f"invalid override {name}={value!r}: {reason}")
        self.name = name
        self.value = value
        self.reason = reason


class RecordingUnavailableError(ScriptedRequestError):
    """The recording to replay is missing, unreadable or outside the allowed folder."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"recording {path!r} unavailable: {reason}")
        self.path = path
        self.reason = reason


class InvalidSettingsError(ScriptedProviderError):
    """A :class:`ScriptedSettings` field is out of its documented bounds."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        super().__init__(f"invalid setting {name}={value!r}: {reason}")
        self.name = name
        self.value = value
        self.reason = reason


class NoScriptError(ScriptedProviderError):
    """The scenario replays foreign bytes (``recording``): there is no script to compute from."""

    def __init__(self, scenario: str) -> None:
        super().__init__(f"scenario {scenario!r} has no script")
        self.scenario = scenario
