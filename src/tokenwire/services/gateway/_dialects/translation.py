"""The translation table: for every caller dialect x provider dialect, each request field's fate.

A request crossing dialects is screened against its pair's table before it is translated: a
``translated`` field is carried over by the dialect modules; a ``refused`` or unknown one gets
a 400 naming the field and the route, unless the caller opted in to dropping (the
``x-tokenwire-drop-params: true`` header, or ``TOKENWIRE_GATEWAY_DROP_PARAMS`` /
``TOKENWIRE_<PROVIDER>_DROP_PARAMS``), and then the answer's ``x-tokenwire-dropped-params``
lists it. Keys inside the objects the translators read are entries of their own, named by
path (``messages.name``, ``tools.strict``); what a folded answer has no place for
(:data:`FOLDED`) is screened the same way on same-dialect routes. docs/providers.md carries
:data:`TABLE`, generated (``python -m tokenwire.services.gateway._dialects.translation``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, assert_never

from tokenwire.providers import Dialect
from tokenwire.services.gateway._dialects.base import CallerDialect
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.variables import GATEWAY_DROP_PARAMS

DROP_HEADER = "x-tokenwire-drop-params"
DROPPED_HEADER = "x-tokenwire-dropped-params"


@dataclass(frozen=True)
class Fate:
    """``translated`` (``how``: to what) or ``refused`` (``how``: why there is no counterpart).

    ``refused_value``: a value a translated field still cannot carry (``store: true`` toward a
    provider that stores nothing); such a value is refused like a refused field.
    ``refused_beside``: another field sharing the one slot the provider has for both
    (``safety_identifier`` and ``user`` toward Anthropic's ``metadata.user_id``); this field is
    refused when that one holds a different value.
    """

    kind: Literal["translated", "refused"]
    how: str
    refused_value: Callable[[Any], bool] | None = None
    refused_beside: str | None = None

    def refuses(self, value: Any, body: Mapping[str, Any]) -> bool:
        """Whether this field, holding ``value`` in ``body``, is refused."""
        if self.kind == "refused" or (self.refused_value and self.refused_value(value)):
            return True
        other = body.get(self.refused_beside) if self.refused_beside else None
        return other is not None and other != value


def _t(how: str) -> Fate:
    return Fate("translated", how)


def _r(why: str) -> Fate:
    return Fate("refused", why)


_NO = "no counterpart"

_STORES_NOTHING = "`false` (the default there: nothing is stored); `true` refused"


def _true(value: Any) -> bool:
    return value is True


# -- OpenAI Chat Completions callers --------------------------------------------------------

_CHAT_COMMON: dict[str, Fate] = {
    "model": _t("the route's model"),
    "messages": _t("messages / contents (text, images, tool calls and results)"),
    "stream": _t("always streamed upstream; a non-streaming caller gets the folded answer"),
    "stream_options": _t("`include_usage`: usage is always read; sent to the caller if asked"),
    "n": _t("only 1 is accepted"),
    "logit_bias": _r(_NO),
    "logprobs": _r(_NO),
    "top_logprobs": _r(_NO),
    "service_tier": _r("tiers differ between providers"),
    "modalities": _r("audio output is not translated"),
    "audio": _r("audio output is not translated"),
    "prediction": _r(_NO),
    "web_search_options": _r("a provider-side tool"),
    "verbosity": _r(_NO),
    "prompt_cache_key": _r(_NO),
    "functions": _r("deprecated; use `tools`"),
    "function_call": _r("deprecated; use `tool_choice`"),
    "messages.name": _r("participant names have no counterpart"),
    "messages.content.image_url.detail": _r("image detail is not translated (`auto` is)"),
}

_ONE_USER_ID = "`metadata.user_id`; refused beside a different `user` (it holds one id)"

CHAT_TO_ANTHROPIC: dict[str, Fate] = {
    **_CHAT_COMMON,
    "tools": _t("`tools` (`input_schema`)"),
    "tool_choice": _t("`tool_choice` auto / any / tool / none"),
    "max_tokens": _t("`max_tokens`"),
    "max_completion_tokens": _t("`max_tokens`"),
    "temperature": _t("`temperature`"),
    "top_p": _t("`top_p`"),
    "stop": _t("`stop_sequences`"),
    "response_format": _t(
        "`json_schema` / `json_object` -> `output_format` json_schema "
        "(beta `structured-outputs-2025-11-13`); `text` -> nothing"
    ),
    "reasoning_effort": _t(
        "`thinking` enabled with budget_tokens low 1024 / medium 8192 / high 24576 "
        "(at most max_tokens - 1); minimal / none -> no thinking"
    ),
    "parallel_tool_calls": _t("false -> `tool_choice.disable_parallel_tool_use: true`"),
    "user": _t("`metadata.user_id`"),
    "safety_identifier": Fate("translated", _ONE_USER_ID, refused_beside="user"),
    "metadata": _r("Anthropic's metadata holds only user_id"),
    "seed": _r(_NO),
    "store": Fate("translated", _STORES_NOTHING, _true),
    "frequency_penalty": _r(_NO),
    "presence_penalty": _r(_NO),
    "tools.function.strict": _t("`strict: true` on the tool"),
}

CHAT_TO_RESPONSES: dict[str, Fate] = {
    **_CHAT_COMMON,
    "tools": _t("function tools (`strict: false`)"),
    "tool_choice": _t("`tool_choice`"),
    "max_tokens": _t("`max_output_tokens`"),
    "max_completion_tokens": _t("`max_output_tokens`"),
    "temperature": _t("`temperature`"),
    "top_p": _t("`top_p`"),
    "stop": _r("the Responses API has no stop sequences"),
    "response_format": _t("`text.format` (json_schema / json_object / text)"),
    "reasoning_effort": _t("`reasoning.effort`"),
    "parallel_tool_calls": _t("`parallel_tool_calls`"),
    "user": _t("`user`"),
    "safety_identifier": _t("`safety_identifier`"),
    "metadata": _t("`metadata`"),
    "store": _t("`store` (false when not sent)"),
    "seed": _r(_NO),
    "frequency_penalty": _r(_NO),
    "presence_penalty": _r(_NO),
    "service_tier": _t("`service_tier`"),
    "prompt_cache_key": _t("`prompt_cache_key`"),
    "tools.function.strict": _t("`strict: true` on the tool"),
}

_NO_STRICT = "Gemini's function declarations have no strict mode"

CHAT_TO_GEMINI: dict[str, Fate] = {
    **_CHAT_COMMON,
    "tools": _t("`functionDeclarations` (`parametersJsonSchema`)"),
    "tool_choice": _t("`toolConfig.functionCallingConfig`"),
    "max_tokens": _t("`generationConfig.maxOutputTokens`"),
    "max_completion_tokens": _t("`generationConfig.maxOutputTokens`"),
    "temperature": _t("`generationConfig.temperature`"),
    "top_p": _t("`generationConfig.topP`"),
    "stop": _t("`generationConfig.stopSequences`"),
    "response_format": _t(
        "`generationConfig.responseMimeType` application/json (+ `responseJsonSchema`)"
    ),
    "reasoning_effort": _t(
        "`generationConfig.thinkingConfig.thinkingBudget` (low 1024 / medium 8192 / high 24576, "
        "minimal / none 0)"
    ),
    "seed": _t("`generationConfig.seed`"),
    "frequency_penalty": _t("`generationConfig.frequencyPenalty`"),
    "presence_penalty": _t("`generationConfig.presencePenalty`"),
    "parallel_tool_calls": _r("Gemini has no switch for parallel calls"),
    "user": _r(_NO),
    "safety_identifier": _r(_NO),
    "metadata": _r(_NO),
    "store": Fate("translated", _STORES_NOTHING, _true),
    "tools.function.strict": _r(_NO_STRICT),
}

# -- Anthropic Messages callers --------------------------------------------------------------

_ANTHROPIC_COMMON: dict[str, Fate] = {
    "model": _t("the route's model"),
    "messages": _t("messages / input / contents (text, images, tool use and results)"),
    "stream": _t("always streamed upstream; a non-streaming caller gets the folded answer"),
    "system": _t("the system prompt (text blocks joined)"),
    "tools: server tools": _r("run by Anthropic (web search, code execution...): not a function"),
    "cache_control": _r("no per-block cache breakpoints"),
    "service_tier": _r("tiers differ between providers"),
    "container": _r("Anthropic's code execution container"),
    "mcp_servers": _r("Anthropic's MCP connector"),
    "context_management": _r("Anthropic's context management"),
}

ANTHROPIC_TO_CHAT: dict[str, Fate] = {
    **_ANTHROPIC_COMMON,
    "max_tokens": _t("`max_completion_tokens` (`max_tokens` for compatible servers)"),
    "tools": _t("function tools"),
    "tool_choice": _t("`tool_choice` auto / required / function / none"),
    "tool_choice.disable_parallel_tool_use": _t("`parallel_tool_calls: false`"),
    "temperature": _t("`temperature`"),
    "top_p": _t("`top_p`"),
    "stop_sequences": _t("`stop`"),
    "metadata": _t("`metadata.user_id` -> `user`"),
    "thinking": _t(
        "`reasoning_effort` by budget: <= 1024 low, <= 8192 medium, more high; disabled -> not "
        "sent (the model's default)"
    ),
    "top_k": _r(_NO),
    "tools.strict": _t("`function.strict: true`"),
    "messages.content.is_error": _r("a Chat Completions tool message has no error flag"),
}

ANTHROPIC_TO_RESPONSES: dict[str, Fate] = {
    **_ANTHROPIC_COMMON,
    "max_tokens": _t("`max_output_tokens`"),
    "tools": _t("function tools (`strict: false`)"),
    "tool_choice": _t("`tool_choice`"),
    "tool_choice.disable_parallel_tool_use": _t("`parallel_tool_calls: false`"),
    "temperature": _t("`temperature`"),
    "top_p": _t("`top_p`"),
    "stop_sequences": _r("the Responses API has no stop sequences"),
    "metadata": _t("`metadata.user_id` -> `user`"),
    "thinking": _t("`reasoning.effort` by budget (as for Chat)"),
    "top_k": _r(_NO),
    "tools.strict": _t("`strict: true`"),
    "messages.content.is_error": _r("a `function_call_output` has no error flag"),
}

ANTHROPIC_TO_GEMINI: dict[str, Fate] = {
    **_ANTHROPIC_COMMON,
    "max_tokens": _t("`generationConfig.maxOutputTokens`"),
    "tools": _t("`functionDeclarations` (`parametersJsonSchema`)"),
    "tool_choice": _t("`toolConfig.functionCallingConfig`"),
    "tool_choice.disable_parallel_tool_use": _r("Gemini has no switch for parallel calls"),
    "temperature": _t("`generationConfig.temperature`"),
    "top_p": _t("`generationConfig.topP`"),
    "top_k": _t("`generationConfig.topK`"),
    "stop_sequences": _t("`generationConfig.stopSequences`"),
    "metadata": _r(_NO),
    "thinking": _t(
        "`generationConfig.thinkingConfig` (`thinkingBudget` = budget_tokens, "
        "`includeThoughts`); disabled -> budget 0"
    ),
    "tools.strict": _r(_NO_STRICT),
    "messages.content.is_error": _t("`functionResponse.response.error` instead of `result`"),
}

# -- OpenAI Responses callers ------------------------------------------------------------------

_RESPONSES_COMMON: dict[str, Fate] = {
    "model": _t("the route's model"),
    "input": _t("messages / contents (text, images, function calls and outputs, reasoning)"),
    "instructions": _t("the system prompt"),
    "stream": _t("always streamed upstream; a non-streaming caller gets the folded answer"),
    "tools": _t("function tools"),
    "tools: built-in tools": _r("run by OpenAI (web search, file search...): not a function"),
    "tool_choice": _t("tool choice auto / none / required / function"),
    "max_output_tokens": _t("the max tokens"),
    "temperature": _t("temperature"),
    "top_p": _t("top_p"),
    "text": _t("`format` json_schema / json_object: structured output as for Chat callers"),
    "reasoning": _t("`effort` as for Chat callers' `reasoning_effort`; summaries as reasoning"),
    "store": Fate("translated", _STORES_NOTHING, _true),
    "include": _r("OpenAI-side extras (encrypted reasoning, logprobs...)"),
    "previous_response_id": _r("server-side conversation state exists only at OpenAI"),
    "conversation": _r("server-side conversation state exists only at OpenAI"),
    "prompt": _r("stored prompts exist only at OpenAI"),
    "truncation": _r(_NO),
    "service_tier": _r("tiers differ between providers"),
    "prompt_cache_key": _r(_NO),
    "top_logprobs": _r(_NO),
    "background": _r("background responses exist only at OpenAI"),
    "max_tool_calls": _r(_NO),
    "stream_options": _r(_NO),
    "reasoning.summary": _t("reasoning the provider returns is sent as summary text"),
    "reasoning.generate_summary": _t("as `reasoning.summary`"),
    "text.verbosity": _r(_NO),
    "input.content.detail": _r("image detail is not translated (`auto` is)"),
}

RESPONSES_TO_CHAT: dict[str, Fate] = {
    **_RESPONSES_COMMON,
    "parallel_tool_calls": _t("`parallel_tool_calls`"),
    "user": _t("`user`"),
    "safety_identifier": Fate(
        "translated", "`user`; refused beside a different `user`", refused_beside="user"
    ),
    "metadata": _r("Chat Completions keeps metadata only for stored completions"),
    "tools.strict": _t("`function.strict: true`"),
}

RESPONSES_TO_ANTHROPIC: dict[str, Fate] = {
    **_RESPONSES_COMMON,
    "parallel_tool_calls": _t("false -> `tool_choice.disable_parallel_tool_use: true`"),
    "user": _t("`metadata.user_id`"),
    "safety_identifier": Fate("translated", _ONE_USER_ID, refused_beside="user"),
    "metadata": _r("Anthropic's metadata holds only user_id"),
    "tools.strict": _t("`strict: true`"),
}

RESPONSES_TO_GEMINI: dict[str, Fate] = {
    **_RESPONSES_COMMON,
    "parallel_tool_calls": _r("Gemini has no switch for parallel calls"),
    "user": _r(_NO),
    "safety_identifier": _r(_NO),
    "metadata": _r(_NO),
    "tools.strict": _r(_NO_STRICT),
}

TABLE: dict[tuple[str, str], dict[str, Fate]] = {
    ("openai-chat", "anthropic-messages"): CHAT_TO_ANTHROPIC,
    ("openai-chat", "openai-responses"): CHAT_TO_RESPONSES,
    ("openai-chat", "gemini"): CHAT_TO_GEMINI,
    ("anthropic-messages", "openai-chat"): ANTHROPIC_TO_CHAT,
    ("anthropic-messages", "openai-responses"): ANTHROPIC_TO_RESPONSES,
    ("anthropic-messages", "gemini"): ANTHROPIC_TO_GEMINI,
    ("openai-responses", "openai-chat"): RESPONSES_TO_CHAT,
    ("openai-responses", "anthropic-messages"): RESPONSES_TO_ANTHROPIC,
    ("openai-responses", "gemini"): RESPONSES_TO_GEMINI,
}
"""One table per (caller dialect, provider dialect) pair that is translated."""


class UntranslatableFieldError(InvalidRequestError):
    """A request field has no counterpart in the provider's dialect (and no drop opt-in)."""

    code = "unsupported_parameter"

    def __init__(self, field: str, caller: str, target: str, route: str, why: str) -> None:
        super().__init__(
            f"{field} cannot be translated from {caller} to {target} (route {route}): {why}; "
            f"send the header {DROP_HEADER}: true to drop it instead",
            param=field,
        )
        self.field, self.caller, self.target, self.route = field, caller, target, route


@dataclass(frozen=True)
class Screened:
    """The body to translate (what was dropped taken out) and the dropped fields, in order."""

    body: dict[str, Any]
    dropped: tuple[str, ...]


def screen(
    body: dict[str, Any], caller: CallerDialect, target: Dialect, route: str, *, drop: bool
) -> Screened:
    """Check every field of a body crossing ``caller`` -> ``target`` against the table.

    Raises :class:`UntranslatableFieldError` for the first refused or unknown field unless
    ``drop``; then every such field is removed and listed (once).
    """
    table = TABLE.get((caller, target))
    if table is None:
        raise InvalidRequestError(
            f"no translation from {caller} to {target} (route {route})", param="model"
        )
    dropped: list[str] = []
    out = dict(body)
    for name, remove in _present(out, caller):
        fate = table.get(name, _r("not in the translation table"))
        if not fate.refuses(out.get(name), out):
            continue
        if not drop:
            raise UntranslatableFieldError(name, caller, target, route, fate.how)
        out = remove(out)
        dropped += [] if name in dropped else [name]
    return Screened(out, tuple(dropped))


_Remove = Callable[[dict[str, Any]], dict[str, Any]]


def _present(body: dict[str, Any], caller: CallerDialect) -> Iterator[tuple[str, _Remove]]:
    """Each field the table rules on that ``body`` holds, with how to take it out."""
    for key, value in list(body.items()):
        if value is None or value in ([], {}):
            continue  # null or empty asks for nothing (SDKs send some fields so)
        yield key, _without_key(key)
    match caller:
        case Dialect.OPENAI_RESPONSES:
            tools = body.get("tools") or []
            if any(isinstance(t, dict) and t.get("type") != "function" for t in tools):
                yield "tools: built-in tools", _without_builtin_tools
        case Dialect.ANTHROPIC_MESSAGES:
            yield from _present_anthropic(body)
        case Dialect.OPENAI_CHAT:
            pass
        case _:
            assert_never(caller)
    for inside in _INSIDE[caller]:
        for key in inside.unread(body):
            yield f"{inside.path}.{key}", inside.without(key)


def _present_anthropic(body: dict[str, Any]) -> Iterator[tuple[str, _Remove]]:
    """What sits inside an Anthropic body that the table rules on."""
    if any(_is_server_tool(t) for t in body.get("tools") or [] if isinstance(t, dict)):
        yield "tools: server tools", _without_server_tools
    if _has_cache_control(body):
        yield "cache_control", _without_cache_control
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
        yield "tool_choice.disable_parallel_tool_use", _without_parallel_switch


# -- keys inside the objects the dialect modules read -----------------------------------------

_Objects = Callable[[dict[str, Any]], Iterator[dict[str, Any]]]


@dataclass(frozen=True)
class _Inside:
    """Objects of a body that a dialect module reads key by key (``objects`` finds them, in
    place), the keys it reads, and values that ask for nothing (``detail: auto``). Any other
    key holding a value is an entry ``<path>.<key>`` of the table."""

    path: str
    objects: _Objects
    read: frozenset[str]
    idle: tuple[tuple[str, Any], ...] = ()

    def unread(self, body: dict[str, Any]) -> list[str]:
        """The keys asking for something that the dialect module does not read, in order."""
        idle = dict(self.idle)
        keys: dict[str, None] = {}
        for obj in self.objects(body):
            for key, value in obj.items():
                if (
                    key in self.read
                    or value in (None, False, "", [], {})
                    or idle.get(key, ...) == value
                ):
                    continue
                keys[key] = None
        return list(keys)

    def without(self, key: str) -> _Remove:
        def remove(body: dict[str, Any]) -> dict[str, Any]:
            out = copy.deepcopy(body)
            for obj in self.objects(out):
                obj.pop(key, None)
            return out

        return remove


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
    elif isinstance(value, list):
        yield from (v for v in value if isinstance(v, dict))


def _field(name: str) -> _Objects:
    return lambda body: _dicts(body.get(name))


def _sub(name: str, sub: str) -> _Objects:
    return lambda body: (v for d in _dicts(body.get(name)) for v in _dicts(d.get(sub)))


def _parts(items: str, kinds: frozenset[str]) -> _Objects:
    """The content parts (or blocks) of the given types in a message list."""

    def parts(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for m in _dicts(body.get(items)):
            content = m.get("content")
            if isinstance(content, list):
                yield from (p for p in _dicts(content) if str(p.get("type")) in kinds)

    return parts


def _chat_images(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for part in _parts("messages", frozenset({"image_url"}))(body):
        yield from _dicts(part.get("image_url"))


def _client_tools(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (t for t in _dicts(body.get("tools")) if not _is_server_tool(t))


def _function_tools(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (t for t in _dicts(body.get("tools")) if t.get("type") == "function")


def _format(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (f for t in _dicts(body.get("text")) for f in _dicts(t.get("format")))


def _json_schema(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    formats = _dicts(body.get("response_format"))
    return (s for f in formats for s in _dicts(f.get("json_schema")))


_ANSWER_METADATA = {"annotations", "citations", "logprobs"}
"""What earlier answers carry about themselves (citations, logprobs): nothing for a model."""
_INSIDE: dict[CallerDialect, tuple[_Inside, ...]] = {
    Dialect.OPENAI_CHAT: (
        # reasoning from the history is not sent: Gemini and Responses need their own, and
        # Anthropic only signed reasoning (docs/gateway.md, "Translated")
        _Inside(
            "messages",
            _field("messages"),
            frozenset(
                {
                    "role",
                    "content",
                    "tool_calls",
                    "tool_call_id",
                    "reasoning_content",
                    *_ANSWER_METADATA,
                }
            ),
        ),
        _Inside(
            "messages.content",
            _parts("messages", frozenset({"text", "image_url"})),
            frozenset({"type", "text", "image_url"}),
        ),
        _Inside(
            "messages.content.image_url", _chat_images, frozenset({"url"}), (("detail", "auto"),)
        ),
        _Inside("tools", _field("tools"), frozenset({"type", "function"})),
        _Inside(
            "tools.function",
            _sub("tools", "function"),
            frozenset({"name", "description", "parameters"}),
        ),
        _Inside(
            "response_format.json_schema", _json_schema, frozenset({"name", "schema", "strict"})
        ),
    ),
    Dialect.ANTHROPIC_MESSAGES: (
        _Inside(
            "messages.content",
            _parts(
                "messages",
                frozenset(
                    {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"}
                ),
            ),
            frozenset(
                {
                    "type",
                    "text",
                    "source",
                    "id",
                    "name",
                    "input",
                    "tool_use_id",
                    "content",
                    "thinking",
                    "signature",
                    "data",
                    "cache_control",
                    *_ANSWER_METADATA,
                }
            ),
        ),
        _Inside(
            "system",
            _field("system"),
            frozenset({"type", "text", "cache_control", *_ANSWER_METADATA}),
        ),
        _Inside(
            "tools",
            _client_tools,
            frozenset({"type", "name", "description", "input_schema", "cache_control"}),
        ),
        _Inside(
            "tool_choice",
            _field("tool_choice"),
            frozenset({"type", "name", "disable_parallel_tool_use"}),
        ),
        _Inside("thinking", _field("thinking"), frozenset({"type", "budget_tokens"})),
    ),
    Dialect.OPENAI_RESPONSES: (
        _Inside(
            "input.content",
            _parts("input", frozenset({"input_text", "output_text", "input_image", "refusal"})),
            frozenset({"type", "text", "image_url", "refusal", *_ANSWER_METADATA}),
            (("detail", "auto"),),
        ),
        _Inside("tools", _function_tools, frozenset({"type", "name", "description", "parameters"})),
        _Inside("reasoning", _field("reasoning"), frozenset({"effort"})),
        _Inside("text", _field("text"), frozenset({"format"})),
        _Inside("text.format", _format, frozenset({"type", "name", "schema", "strict"})),
    ),
}
"""Per caller dialect, the objects its module reads key by key (what the others mean is in
the table, or refused)."""


def _without_key(key: str) -> _Remove:
    def remove(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != key}

    return remove


def _is_server_tool(tool: dict[str, Any]) -> bool:
    """Anthropic's server tools carry a versioned ``type`` (``web_search_20250305``...);
    client tools have ``type`` ``custom`` or none."""
    kind = tool.get("type")
    return isinstance(kind, str) and kind != "custom"


def _without_server_tools(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return body
    kept = [t for t in tools if not (isinstance(t, dict) and _is_server_tool(t))]
    return {**body, "tools": kept} if kept else {k: v for k, v in body.items() if k != "tools"}


def _without_builtin_tools(body: dict[str, Any]) -> dict[str, Any]:
    kept = [t for t in body["tools"] if isinstance(t, dict) and t.get("type") == "function"]
    return {**body, "tools": kept}


def _has_cache_control(value: Any) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(_has_cache_control(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_cache_control(v) for v in value)
    return False


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _without_cache_control(body: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _strip_cache_control(v) if k in ("system", "messages", "tools") else v
        for k, v in body.items()
    }


def _without_parallel_switch(body: dict[str, Any]) -> dict[str, Any]:
    choice = {k: v for k, v in body["tool_choice"].items() if k != "disable_parallel_tool_use"}
    return {**body, "tool_choice": choice}


def wants_drop(headers: Mapping[str, str], env: Mapping[str, str], provider: str) -> bool:
    """The drop opt-in: the request header, or the gateway's or the route's setting."""
    names = (GATEWAY_DROP_PARAMS.env, f"TOKENWIRE_{_env_name(provider)}_DROP_PARAMS")
    values = [headers.get(DROP_HEADER, ""), *(env.get(n, "") for n in names)]
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in values)


def _env_name(provider: str) -> str:
    return provider.upper().replace("-", "_")


# -- non-streaming answers on a same-dialect route ---------------------------------------------


@dataclass(frozen=True)
class Unfolded:
    """A field whose output a folded answer has no place for, when ``asks`` holds for its
    value (``logprobs: false`` asks for nothing)."""

    why: str
    asks: Callable[[Any], bool] = lambda value: True


def _audio(value: Any) -> bool:
    return isinstance(value, list) and "audio" in value


_FOLDED_HAS_NO = "a non-streaming answer is folded from the provider's stream and has no {}"
FOLDED: dict[CallerDialect, dict[str, Unfolded]] = {
    Dialect.OPENAI_CHAT: {
        "logprobs": Unfolded(_FOLDED_HAS_NO.format("logprobs"), _true),
        "top_logprobs": Unfolded(_FOLDED_HAS_NO.format("logprobs")),
        "modalities": Unfolded(_FOLDED_HAS_NO.format("audio") + " (when it lists audio)", _audio),
        "audio": Unfolded(_FOLDED_HAS_NO.format("audio")),
    },
    Dialect.OPENAI_RESPONSES: {
        "top_logprobs": Unfolded(_FOLDED_HAS_NO.format("logprobs")),
        "include": Unfolded(
            _FOLDED_HAS_NO.format("included extras (encrypted reasoning, logprobs, sources...)")
        ),
    },
    Dialect.ANTHROPIC_MESSAGES: {},
}
"""Per caller dialect, what a folded answer (a non-streaming caller on a same-dialect route,
whose body is otherwise forwarded as sent) has no place for: refused, or dropped on opt-in, as
the table's refused fields are. A streaming caller gets the provider's events as they are."""


def screen_folded(
    body: dict[str, Any], caller: CallerDialect, route: str, *, drop: bool
) -> Screened:
    """Check a non-streaming same-dialect body against :data:`FOLDED` (as :func:`screen`)."""
    fates = FOLDED[caller]
    dropped = tuple(
        k for k, v in body.items() if k in fates and v not in (None, [], {}) and fates[k].asks(v)
    )
    if dropped and not drop:
        field, why = dropped[0], f"{fates[dropped[0]].why} (a streaming call gets it)"
        target = f"a non-streaming {caller} answer"
        raise UntranslatableFieldError(field, caller, target, route, why)
    return Screened({k: v for k, v in body.items() if k not in dropped}, dropped)


# -- the docs table ---------------------------------------------------------------------------

DOC_BEGIN = (
    "<!-- translation-table: generated by tokenwire.services.gateway._dialects.translation -->"
)
DOC_END = "<!-- /translation-table -->"


def counts() -> dict[str, int]:
    """How many (pair, field) entries are translated and refused (refused = dropped on opt-in)."""
    fates = [f.kind for table in TABLE.values() for f in table.values()]
    return {"translated": fates.count("translated"), "refused": fates.count("refused")}


def render_markdown() -> str:
    """The docs/providers.md section listing every field of every pair with its fate."""
    lines = [DOC_BEGIN, ""]
    c = counts()
    lines.append(
        f"{len(TABLE)} translated pairs, {c['translated'] + c['refused']} entries: "
        f"{c['translated']} translated, {c['refused']} refused (each of those dropped instead "
        "with the opt-in). A field not listed is refused the same way."
    )
    for (caller, target), table in TABLE.items():
        lines += ["", f"### {caller} -> {target}", "", "| field | fate | how / why |"]
        lines.append("| --- | --- | --- |")
        for field, fate in sorted(table.items()):
            lines.append(f"| `{field}` | {fate.kind} | {fate.how} |")
    lines += ["", "### non-streaming answers on a same-dialect route", ""]
    lines.append(
        "The body is forwarded as sent, but the answer is folded from the provider's stream; "
        "these fields are refused for a non-streaming caller (dropped with the opt-in):"
    )
    lines += ["", "| caller | field | why |", "| --- | --- | --- |"]
    for caller, unfolded in FOLDED.items():
        for field, what in sorted(unfolded.items()):
            lines.append(f"| {caller} | `{field}` | {what.why} |")
    lines += ["", DOC_END]
    return "\n".join(lines) + "\n"


def replace_section(doc: str) -> str:
    """``doc`` with its generated section replaced by :func:`render_markdown`."""
    start, end = doc.index(DOC_BEGIN), doc.index(DOC_END) + len(DOC_END) + 1
    return doc[:start] + render_markdown() + doc[end:]


if __name__ == "__main__":  # regenerate: python -m ...gateway._dialects.translation FILE
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(replace_section(text))
