"""Threading: a request without ``X-Tokenwire-Session`` joins the session it continues.

A request is matched by the most specific key it carries, read once from the step registry
(:meth:`~tokenwire.broker.StepAllocator.thread_mark`): the tool-call id its trailing tool
results answer, else the Responses ``previous_response_id``, else the conversation up to and
including its last assistant message. Each step that ends with an answer marks its keys: the
ids of its tool calls, the response id its Responses caller saw, and the conversation it was
asked plus its answer. Keys are SHA-256 hashes scoped to the caller's tenant; a key two
sessions' answers share names neither. The step's parent is the step it matched, else the
previous step of its turn, else the step ``X-Tokenwire-Parent`` names (a sub-agent's).
``X-Tokenwire-Thread: off`` opts a request out. docs/gateway.md, "Threading"; ADR 0037.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from tokenwire.broker import BrokerError, StepAllocator, ThreadMark
from tokenwire.schemas import (
    ContentBlock,
    ImageBlock,
    Message,
    StepLink,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._dialects.neutral import NeutralMessage, plain_call_id
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    GatewayError,
    InvalidRequestError,
)

THREAD_HEADER = "x-tokenwire-thread"
PARENT_HEADER = "x-tokenwire-parent"
MATCH_HEADER = "x-tokenwire-session-match"
Match = Literal["tool-call-id", "previous-response", "content", "new", "header"]
"""How a request's session was found (the answer's ``x-tokenwire-session-match``)."""
_PARENT = re.compile(r"([A-Za-z0-9_-]{1,128})/([0-9]{1,15})/([0-9]{1,15})")
_VERSION = "tw-thread-1"


@dataclass(frozen=True, slots=True)
class ThreadKey:
    """One key of a request: how it matches and its hash (hex)."""

    kind: Literal["tool-call-id", "previous-response", "content"]
    hash: str


class Conversation:
    """A request's conversation in the canonical form (:func:`history`), made when first
    needed: before the provider call only for a request that is looked up, else when its
    step answers (off the time to first chunk). None: no neutral form (not threaded)."""

    __slots__ = ("_read", "_value")

    def __init__(self, read: Callable[[], Sequence[NeutralMessage]]) -> None:
        self._read: Callable[[], Sequence[NeutralMessage]] | None = read
        self._value: tuple[object, ...] | None = None

    def value(self) -> tuple[object, ...] | None:
        if self._read is not None:
            read, self._read = self._read, None
            try:
                self._value = history(read())
            except GatewayError:  # content without a neutral form: not threaded, never refused
                self._value = None
        return self._value


@dataclass(frozen=True, slots=True, kw_only=True)
class StepThread:
    """A step's place in its session's graph and what it marks when it answers.

    ``matched`` is the step the request continues (threaded), ``spawned_by`` the step its
    ``X-Tokenwire-Parent`` names; ``conversation`` the one it was asked (None: it marks
    nothing: opted out)."""

    match: Match
    scope: str
    matched: StepLink | None = None
    spawned_by: StepLink | None = None
    conversation: Conversation | None = None

    def parent(self, identity: StepIdentity) -> StepLink | None:
        """The step this one follows: the one it continues, else the previous step of its
        turn, else the step that spawned its session."""
        if self.matched is not None:
            return self.matched
        if identity.step > 0:
            return StepLink(identity.session, identity.turn, identity.step - 1)
        return self.spawned_by

    def marks(self, answer: Message, response_id: str | None) -> list[str]:
        """The keys a step's ``answer`` is found by: each tool call's id, the response id its
        caller saw, the conversation up to and including the answer."""
        asked = self.conversation.value() if self.conversation is not None else None
        if asked is None:
            return []
        keys = [_hash(self.scope, "call", plain_call_id(c.id)) for c in answer.tool_calls]
        if response_id is not None:
            keys.append(_hash(self.scope, "response", response_id))
        answered = _canonical([*asked, ("assistant", _blocks(answer.content))])
        keys.append(_hash(self.scope, "content", answered))
        return keys

    def headers(self, identity: StepIdentity | None) -> dict[str, str]:
        """``x-tokenwire-session-match`` and, when the step has one, ``x-tokenwire-parent``."""
        out: dict[str, str] = {MATCH_HEADER: self.match}
        parent = self.parent(identity) if identity is not None else self.matched
        if parent is not None:
            out[PARENT_HEADER] = str(parent)
        return out


def read_parent(headers: Mapping[str, str]) -> StepLink | None:
    """``X-Tokenwire-Parent: <session>/<turn>/<step>`` (400 when malformed)."""
    value = headers.get(PARENT_HEADER)
    if value is None:
        return None
    found = _PARENT.fullmatch(value)
    if found is None:
        raise InvalidRequestError(
            "X-Tokenwire-Parent must be <session>/<turn>/<step>", param=PARENT_HEADER
        )
    return StepLink(found.group(1), int(found.group(2)), int(found.group(3)))


def threading_off(headers: Mapping[str, str]) -> bool:
    """Whether the request opts out (``X-Tokenwire-Thread: off``; anything but ``on`` /
    ``off`` is a 400)."""
    value = headers.get(THREAD_HEADER)
    if value is None or value.lower() == "on":
        return False
    if value.lower() == "off":
        return True
    raise InvalidRequestError("X-Tokenwire-Thread must be on or off", param=THREAD_HEADER)


def history(messages: Sequence[NeutralMessage]) -> tuple[object, ...]:
    """The conversation in the canonical form its hashes are made of: per message its role,
    text (joined), images, tool calls (arguments as sorted compact JSON) and tool results;
    reasoning left out (SDKs drop it), consecutive messages of one role joined."""
    out: list[tuple[str, list[object]]] = []
    for message in messages:
        blocks = _blocks(message.content)
        if out and out[-1][0] == message.role:
            out[-1] = (message.role, _joined(out[-1][1] + blocks))
        else:
            out.append((message.role, blocks))
    return tuple(out)


def lookup_key(
    scope: str, conversation: tuple[object, ...], previous_response_id: str | None
) -> ThreadKey | None:
    """The most specific key of a request (None: nothing the gateway answered in it)."""
    turns = [m for m in conversation if isinstance(m, tuple)]
    last = max((i for i, m in enumerate(turns) if m[0] == "assistant"), default=-1)
    for role, blocks in turns[last + 1 :]:
        for block in blocks if role == "tool" else ():
            if isinstance(block, tuple) and block[0] == "r":
                return ThreadKey("tool-call-id", _hash(scope, "call", str(block[1])))
    if previous_response_id:
        return ThreadKey("previous-response", _hash(scope, "response", previous_response_id))
    if last < 0:
        return None
    return ThreadKey("content", _hash(scope, "content", _canonical(turns[: last + 1])))


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadRequest:
    """What threading reads of a request: the caller's tenant (``scope``), the session it
    names, its headers, its conversation (a call: only made when needed; a 400 from it means
    no neutral form), whether it opens one, its ``previous_response_id`` (Responses)."""

    scope: str
    named: str | None
    headers: Mapping[str, str]
    conversation: Callable[[], Sequence[NeutralMessage]]
    opens: bool = False
    """Nothing in it came from the model (``CallerRequest.opens_conversation``): no lookup
    unless it names a ``previous_response_id``."""
    previous_response_id: str | None = None


async def thread_request(
    steps: StepAllocator, request: ThreadRequest, *, enabled: bool
) -> tuple[str | None, StepThread]:
    """The session a request joins (None: the one it names, or a new one) and its thread.

    At most one registry read: none when the request names its session, opts out, or carries
    nothing the gateway answered (a conversation's first call). A step of a named session
    writes no thread keys: its caller continues it by name."""
    spawned_by = read_parent(request.headers)
    off = not enabled or threading_off(request.headers)
    conversation = None if off else Conversation(request.conversation)
    scope = request.scope
    if request.named is not None:  # a named session is continued by name: it marks nothing
        return None, StepThread(match="header", scope=scope, spawned_by=spawned_by)
    new = StepThread(match="new", scope=scope, spawned_by=spawned_by, conversation=conversation)
    looked_up = not request.opens or request.previous_response_id is not None
    asked = conversation.value() if conversation is not None and looked_up else None
    if asked is None:
        return None, new
    key = lookup_key(scope, asked, request.previous_response_id)
    mark = await find(steps, key) if key is not None else None
    if key is None or mark is None:
        return None, new
    matched = StepLink(mark.session, mark.turn, mark.step)
    thread = StepThread(
        match=key.kind,
        scope=scope,
        matched=matched,
        spawned_by=spawned_by,
        conversation=conversation,
    )
    return mark.session, thread


async def find(steps: StepAllocator, key: ThreadKey) -> ThreadMark | None:
    """The step ``key`` names (one registry read); None when none or ambiguous."""
    try:
        mark = await steps.thread_mark(key.hash)
    except BrokerError as exc:
        raise BrokerUnavailableError("the step registry is unavailable", detail=str(exc)) from exc
    if mark is None or mark.ambiguous:
        return None
    if mark.pointer is not None:
        steps.recall(mark.session, mark.pointer)
    return mark


def _blocks(content: Sequence[ContentBlock]) -> list[object]:
    out: list[object] = []
    for block in content:
        match block:
            case TextBlock() if block.text:
                out.append(block.text)
            case ToolCallBlock():
                out.append(("c", plain_call_id(block.id), block.name, _arguments(block.arguments)))
            case ToolResultBlock():
                out.append(("r", plain_call_id(block.tool_call_id), block.content, block.is_error))
            case ImageBlock():
                out.append(("i", block.media_type, block.url or _digest(block.data or "")))
            case _:  # reasoning, empty text: not part of what is matched
                pass
    return _joined(out)


def _joined(blocks: list[object]) -> list[object]:
    """Adjacent texts as one (a dialect may split what another sends whole)."""
    out: list[object] = []
    for block in blocks:
        if isinstance(block, str) and out and isinstance(out[-1], str):
            out[-1] = out[-1] + block
        else:
            out.append(block)
    return out


def _arguments(raw: str) -> str:
    """Tool-call arguments as sorted compact JSON (SDKs re-serialise them), else as sent."""
    try:
        value: Any = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return raw
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(conversation: Sequence[object]) -> bytes:
    return msgspec.json.encode(list(conversation))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _hash(scope: str, kind: str, value: str | bytes) -> str:
    payload = value if isinstance(value, bytes) else value.encode()
    head = msgspec.json.encode([_VERSION, scope, kind])
    return hashlib.sha256(head + b"\n" + payload).hexdigest()
