"""The demo fleet: concurrent agent sessions driving the gateway with the official openai SDK.

Each session runs ``turns`` turns of ``steps`` steps. Step 0 of a turn asks for tools
(``scripted/tools``: two parallel tool calls), middle steps reason, the last answers in text;
the agent feeds tool results back as a real agent loop would. Two steps are special, so that the
demo shows both failure paths: session 0 ends turn 0 with a max-tokens cut inside a tool call,
and session 1 meets a provider error mid-stream at turn 0, step 0.

:func:`expected_totals` computes what the store must hold from the plan alone, independently
of what the pipeline did; the demo compares the two.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

# What the agents offer the model (a real provider decides whether to call them).
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {
        "name": name, "description": f"Look up the {what} for a place.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                       "required": ["location"]}}}
    for name, what in (("get_weather", "weather"), ("get_time", "local time"))
]  # fmt: skip

MAX_TOKENS_AT = (0, 0)  # (session, turn): its last step is cut by max-tokens
ERROR_AT = (1, 0, 0)  # (session, turn, step): the provider fails mid-stream


@dataclass(frozen=True)
class FleetPlan:
    """How many sessions, turns and steps, and the id prefix of the sessions."""

    sessions: int
    turns: int
    steps: int
    run_id: str
    provider: str = "scripted"
    model: str | None = None

    @property
    def scripted(self) -> bool:
        """Offline: scenarios chosen per step, outcomes known in advance."""
        return self.provider == "scripted"

    def session_id(self, k: int) -> str:
        return f"demo-{self.run_id}-{k:03d}"

    def model_for(self, k: int, turn: int, step: int) -> str:
        """The ``provider/model`` a step asks the gateway for."""
        if self.scripted:
            return f"scripted/{self.scenario(k, turn, step)}"
        return f"{self.provider}/{self.model}"

    def scenario(self, k: int, turn: int, step: int) -> str:
        """The scripted scenario of one step (see the module docstring)."""
        if (k, turn, step) == ERROR_AT:
            return "error"
        if (k, turn) == MAX_TOKENS_AT and step == self.steps - 1:
            return "max-tokens"
        if step == self.steps - 1:
            return "text"
        return "tools" if step == 0 else "reasoning"


@dataclass(frozen=True)
class ExpectedTotals:
    """What a correct pipeline persists for a plan."""

    steps: int
    messages: int
    errors: int
    max_tokens_messages: int


def expected_totals(plan: FleetPlan) -> ExpectedTotals:
    """Count the plan's steps by outcome, from the plan alone.

    Against a real provider only the number of steps is known in advance (every step ends as
    a message or a recorded error); the other counts are -1 (unknown).
    """
    if not plan.scripted:
        steps = plan.sessions * plan.turns * plan.steps
        return ExpectedTotals(steps=steps, messages=-1, errors=-1, max_tokens_messages=-1)
    scenarios = [
        plan.scenario(k, t, s)
        for k in range(plan.sessions)
        for t in range(plan.turns)
        for s in range(plan.steps)
    ]
    errors = scenarios.count("error")
    return ExpectedTotals(
        steps=len(scenarios),
        messages=len(scenarios) - errors,
        errors=errors,
        max_tokens_messages=scenarios.count("max-tokens"),
    )


@dataclass
class FleetResult:
    """What the agents saw: per step outcome and client-side time to first chunk."""

    completed_steps: int = 0
    provider_errors: int = 0
    tool_calls: int = 0
    client_ttfc_s: list[float] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    wall_s: float = 0.0


async def run_fleet(
    plan: FleetPlan, gateway_url: str, on_step: Callable[[], None] = lambda: None
) -> FleetResult:
    """Run every session of ``plan`` concurrently against the gateway."""
    result = FleetResult(sessions=[plan.session_id(k) for k in range(plan.sessions)])
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="demo", max_retries=0)
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(_session(client, plan, k, result, on_step) for k in range(plan.sessions))
        )
    finally:
        await client.close()
    result.wall_s = time.perf_counter() - started
    return result


async def _session(
    client: openai.AsyncOpenAI,
    plan: FleetPlan,
    k: int,
    result: FleetResult,
    on_step: Callable[[], None],
) -> None:
    for turn in range(plan.turns):
        messages: list[dict[str, object]] = [
            {
                "role": "user",
                "content": f"Session {k}, turn {turn}: plan the trip and check the weather.",
            }
        ]
        for step in range(plan.steps):
            headers = {
                "X-Tokenwire-Session": plan.session_id(k),
                "X-Tokenwire-Turn": str(turn),
                "X-Tokenwire-Step": str(step),
            }
            await _step(client, plan.model_for(k, turn, step), messages, headers, result)
            on_step()


async def _step(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, object]],
    headers: dict[str, str],
    result: FleetResult,
) -> None:
    sent = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=cast("list[ChatCompletionMessageParam]", messages), stream=True,
            extra_headers=headers, stream_options={"include_usage": True},
            tools=TOOLS, max_tokens=512,
        )  # fmt: skip
        async for chunk in stream:
            first = first or time.perf_counter()
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                text.append(choice.delta.content or "")
                for call in choice.delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] = call.function.name or slot["name"]
                        slot["arguments"] += call.function.arguments or ""
    except openai.APIError:
        result.provider_errors += 1
        return
    if first is not None:
        result.client_ttfc_s.append(first - sent)
    result.completed_steps += 1
    if finish == "length":
        calls = {}  # a tool call cut by max-tokens is never dispatched
    _continue_conversation(messages, "".join(text), calls, result)


def _continue_conversation(
    messages: list[dict[str, object]],
    text: str,
    calls: dict[int, dict[str, str]],
    result: FleetResult,
) -> None:
    """Append the assistant's turn and, for each tool call, the tool's result."""
    tool_calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for _, c in sorted(calls.items())
    ]
    messages.append(
        {
            "role": "assistant",
            "content": text or None,
            **({"tool_calls": tool_calls} if tool_calls else {}),
        }
    )
    for call in tool_calls:
        result.tool_calls += 1
        arguments = call["function"]["arguments"]  # type: ignore[index]  # a tool call's JSON, read by key
        try:
            parsed = json.loads(arguments)  # parsed once, at dispatch, as the contract says
        except ValueError:
            parsed = None
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": json.dumps({"ok": True, "echo": parsed}),
            }
        )
