"""Scripts: what a scenario streams, dialect-neutral, derived only from scenario, seed and request.

A script is pure data: the renderers turn it into bytes of one wire format, and
``expected_outcome`` reads the same script, never the bytes, to state the ground truth.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Literal, get_args

import msgspec

from tokenwire.services.scripted_provider._errors import UnknownScenarioError
from tokenwire.services.scripted_provider._request import Dialect, StepRequest
from tokenwire.services.scripted_provider._settings import ScriptedSettings

Scenario = Literal[
    "text",
    "reasoning",
    "tools",
    "max-tokens",
    "error",
    "drop",
    "truncate",
    "stall",
    "http-429",
    "http-500",
    "recording",
]
"""The scenarios, selected by the model name (``text`` or ``scripted/text``)."""

SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)

Ending = Literal["stop", "tool-calls", "max-tokens", "error", "drop", "truncate"]
"""How a scripted stream ends.

``error``: an in-band provider error; ``drop``: the connection is aborted; ``truncate``: the
body ends cleanly but without the provider's final events.
"""

DEFAULT_TOOLS = ("get_weather", "get_time")
INPUT_TOKENS_PER_MESSAGE = 10
"""Scripted prompt size: input tokens are this many per request message (at least one)."""

_WORDS = (
    "amber",
    "harbor",
    "lantern",
    "quartz",
    "naïve",
    "café",
    "orbit",
    "moss",
    "signal",
    "tide",
    "ember",
    "🙂",
    "granite",
    "willow",
    "über",
    "cobalt",
    "meadow",
    "prism",
)
# Non-ASCII words on purpose: multi-byte UTF-8 must survive every split of the bytes.


class ScriptedToolCall(msgspec.Struct, frozen=True):
    """A tool call as streamed: its argument string in fragments (cut short if truncated)."""

    id: str
    name: str
    fragments: tuple[str, ...]

    @property
    def arguments(self) -> str:
        """The argument string the fragments add up to."""
        return "".join(self.fragments)


class ProviderFailure(msgspec.Struct, frozen=True):
    """An error the provider reports, in-band or as an HTTP status, in both dialects' terms."""

    message: str
    openai_code: str
    anthropic_type: str
    openai_status: int
    anthropic_status: int
    retryable: bool = True

    def status(self, dialect: Dialect) -> int:
        """The HTTP status this failure is answered with when it comes before the stream."""
        return self.openai_status if dialect == "openai" else self.anthropic_status


class Script(msgspec.Struct, frozen=True, kw_only=True):
    """One step's stream, dialect-neutral. Fragments stream in the order reasoning, text, tools.

    ``stall_after`` is the number of fragments sent before the stream stops for ``stall_s``;
    ``failure`` is set for the ``error`` ending and for HTTP-status scenarios (``http_status``).
    """

    scenario: Scenario
    dialect: Dialect
    message_id: str
    request_id: str
    reasoning: tuple[str, ...] = ()
    signature: str | None = None
    text: tuple[str, ...] = ()
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    ending: Ending = "stop"
    failure: ProviderFailure | None = None
    http_status: int | None = None
    stall_after: int | None = None
    stall_s: float = 0.0
    input_tokens: int = INPUT_TOKENS_PER_MESSAGE

    @property
    def fragment_count(self) -> int:
        """Fragments of content the stream carries (reasoning, text and tool arguments)."""
        args = sum(len(c.fragments) for c in self.tool_calls)
        return len(self.reasoning) + len(self.text) + args


_OVERLOADED = ProviderFailure(
    message="The scripted upstream is overloaded.",
    openai_code="server_error",
    anthropic_type="overloaded_error",
    openai_status=503,
    anthropic_status=529,
)
_RATE_LIMITED = ProviderFailure(
    message="Rate limit reached for scripted requests.",
    openai_code="rate_limit_exceeded",
    anthropic_type="rate_limit_error",
    openai_status=429,
    anthropic_status=429,
)
_SERVER_ERROR = ProviderFailure(
    message="The scripted upstream had an internal error.",
    openai_code="server_error",
    anthropic_type="api_error",
    openai_status=500,
    anthropic_status=500,
)


class _Gen:
    """Deterministic generator of one step's content, seeded by settings and request."""

    def __init__(self, settings: ScriptedSettings, request: StepRequest, scenario: str) -> None:
        key = f"{settings.seed}|{scenario}|{request.session}|{request.message_count}"
        digest = hashlib.sha256(key.encode()).digest()
        self.rng = random.Random(digest)
        self.settings = settings

    def ident(self, prefix: str, n: int) -> str:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
        return prefix + "".join(self.rng.choice(alphabet) for _ in range(n))

    def prose(self, n_chars: int) -> str:
        """Words after the sentinel tag, cut to ``n_chars`` (never cutting the tag)."""
        words = [self.settings.sentinel_tag]
        total = len(words[0])
        while total < n_chars:
            words.append(self.rng.choice(_WORDS))
            total += len(words[-1]) + 1
        return " ".join(words)[: max(n_chars, len(self.settings.sentinel_tag))]

    def fragments(self, count: int) -> tuple[str, ...]:
        return split(
            self.prose(count * self.settings.fragment_size), self.settings.fragment_size, count
        )

    def arguments(self, count: int) -> str:
        """A JSON object whose encoding is about ``count`` fragments long."""
        size = self.settings.fragment_size
        head = {"location": self.rng.choice(_WORDS), "unit": "celsius"}
        base = len(msgspec.json.encode({**head, "note": ""}).decode())
        note = self.prose(max(0, count * size - base))
        return msgspec.json.encode({**head, "note": note}).decode()


def split(text: str, size: int, count: int) -> tuple[str, ...]:
    """``count`` fragments of ``size`` characters; the last one takes whatever remains."""
    head = [text[i * size : (i + 1) * size] for i in range(count - 1)]
    return (*head, text[(count - 1) * size :])


def split_all(text: str, size: int, minimum: int) -> tuple[str, ...]:
    """Fragments of ``size`` characters, or ``minimum`` equal ones if that would be fewer."""
    size = min(size, -(-len(text) // minimum))
    return tuple(text[i : i + size] for i in range(0, len(text), size))


_Builder = Callable[["Script", "_Gen", StepRequest], "Script"]


def build_script(
    scenario: str, request: StepRequest, settings: ScriptedSettings, dialect: Dialect
) -> Script:
    """The script of ``scenario`` for this request; pure, so it is the ground truth.

    Raises :class:`UnknownScenarioError` for a name not in :data:`SCENARIOS`.
    """
    if scenario not in SCENARIOS:
        raise UnknownScenarioError(scenario)
    gen = _Gen(settings, request, scenario)
    base = Script(
        scenario=scenario,
        dialect=dialect,
        message_id=gen.ident("chatcmpl-" if dialect == "openai" else "msg_01", 24),
        request_id=gen.ident("req_", 24),
        input_tokens=INPUT_TOKENS_PER_MESSAGE * max(1, request.message_count),
    )
    return _SCRIPTS[base.scenario](base, gen, request)


def _text(base: Script, gen: _Gen, request: StepRequest) -> Script:
    return msgspec.structs.replace(base, text=gen.fragments(gen.settings.length))


def _reasoning(base: Script, gen: _Gen, request: StepRequest) -> Script:
    reasoning = gen.fragments(gen.settings.length)
    digest = hashlib.sha256("".join(reasoning).encode()).hexdigest()
    text = gen.fragments(gen.settings.length)
    return msgspec.structs.replace(base, reasoning=reasoning, signature=f"sig-{digest}", text=text)


def _tool_call(base: Script, gen: _Gen, name: str, minimum: int = 1) -> ScriptedToolCall:
    """A call whose arguments are about ``length`` fragments long, in at least ``minimum``."""
    prefix = "call_" if base.dialect == "openai" else "toolu_01"
    call_id = gen.ident(prefix, 24)
    arguments = gen.arguments(gen.settings.length)
    fragments = split_all(arguments, gen.settings.fragment_size, minimum)
    return ScriptedToolCall(call_id, name, fragments)


def _tools(base: Script, gen: _Gen, request: StepRequest) -> Script:
    if request.last_is_tool_result:  # step 1 of an agent loop answers, so loops end
        return _text(base, gen, request)
    names = (*request.tool_names, *DEFAULT_TOOLS)
    calls = tuple(_tool_call(base, gen, names[i]) for i in range(2))
    return msgspec.structs.replace(base, tool_calls=calls, ending="tool-calls")


def _max_tokens(base: Script, gen: _Gen, request: StepRequest) -> Script:
    text = gen.fragments(gen.settings.length)
    name = (*request.tool_names, *DEFAULT_TOOLS)[0]
    whole = _tool_call(base, gen, name, minimum=2)
    cut = msgspec.structs.replace(whole, fragments=whole.fragments[:-1])  # cut inside the JSON
    return msgspec.structs.replace(base, text=text, tool_calls=(cut,), ending="max-tokens")


def _error(base: Script, gen: _Gen, request: StepRequest) -> Script:
    text = gen.fragments(gen.settings.length)
    return msgspec.structs.replace(base, text=text, ending="error", failure=_OVERLOADED)


def _drop(base: Script, gen: _Gen, request: StepRequest) -> Script:
    return msgspec.structs.replace(_text(base, gen, request), ending="drop")


def _truncate(base: Script, gen: _Gen, request: StepRequest) -> Script:
    return msgspec.structs.replace(_text(base, gen, request), ending="truncate")


def _stall(base: Script, gen: _Gen, request: StepRequest) -> Script:
    script = _text(base, gen, request)
    after = max(1, len(script.text) // 2)
    return msgspec.structs.replace(script, stall_after=after, stall_s=gen.settings.stall_s)


def _http(failure: ProviderFailure) -> _Builder:
    def build(base: Script, gen: _Gen, request: StepRequest) -> Script:
        return msgspec.structs.replace(
            base, ending="error", failure=failure, http_status=failure.status(base.dialect)
        )

    return build


def _recording(base: Script, gen: _Gen, request: StepRequest) -> Script:
    return base  # the bytes come from a file; the app never renders this script


_SCRIPTS: dict[Scenario, _Builder] = {
    "text": _text,
    "reasoning": _reasoning,
    "tools": _tools,
    "max-tokens": _max_tokens,
    "error": _error,
    "drop": _drop,
    "truncate": _truncate,
    "stall": _stall,
    "http-429": _http(_RATE_LIMITED),
    "http-500": _http(_SERVER_ERROR),
    "recording": _recording,
}
