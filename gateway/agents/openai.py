"""The `openai` agent: any OpenAI-compatible chat-completions endpoint, with guarded tools.

One turn is the system prompt, the room's history (`turn.history`, DESIGN.md §3: the
bot's own messages as `assistant`, everyone else's as `user` with "Name: text"), the
message as "sender: text", and a tool-calling loop. Every tool call goes through a
LoopGuard made for the turn from the room's `policy.tool_loop`
(`turn.resolved.tool_loop`; check → run → record → check, `guards.tool_wrapper`): a BLOCK
result or a WARN-annotated result is fed back to the model as the tool message; HALT ends the
turn with a short message in the room and `halt=Halt("tool_loop", code)`. Every HTTP
request to the model goes through the agent's CallStore (circuit = agent name + room
and thread; the fingerprint is the model plus the last two messages) under the room's
`policy.call_loop` (`turn.resolved.call_loop`: `max_repeats`, `window_seconds`,
`pause_seconds`, per channel rule and by `/loop set call_loop.max_repeats 3`): a refused
call is never sent, and the turn ends with `halt=Halt("call_loop", code)`.

Decisions where DESIGN.md is silent:
- The sender's display name is put in the user message text ("Alice: hi"), not in the
  `name` field, which OpenAI restricts to `[A-Za-z0-9_-]` and local servers often ignore.
- Tools are imported when the agent is built, so a bad `module:function` fails at start-up
  (`ConfigError` on `agents.<name>.tools.<i>`). A sync tool runs in a worker thread; every
  tool is bounded by the agent's `timeout` (a timed-out tool is a failed call for the
  guard, and its thread is left to finish on its own). A tool's failure, an unknown tool
  or unreadable arguments go back to the model as `{"error": "..."}` and count for the
  guard like any failed call.
- MCP tools (`mcp_servers`, `gateway.agents.mcp`) are offered beside the Python tools as
  `<server>__<tool>`, from the servers connected when the turn starts (the servers start on
  the agent's first turn); each is registered with the turn's LoopGuard by its MCP
  annotations, then its name, and called under the same check → run → record → check and
  `timeout`. A result with `isError`, or a server gone during the call, is a failed call.
- `max_tool_rounds` rounds of tool calls are run; if the model still asks for tools after
  that, the turn ends with a short message and `halt=Halt("agent", "max_tool_rounds")`.
- Provider failures (429, 408, 5xx, timeouts, dropped connections) are retried up to
  `max_attempts` in all, waiting Retry-After (or `retry-after-ms`) when given, else
  0.5 s, 1 s, 2 s…; a Retry-After longer than `max_retry_wait` is not waited for. Each
  attempt passes the call guard; a failed attempt is uncounted (`record_outcome`).
  Other 4xx stay counted and are not retried. The final failure answers with a short
  apology; the log line has the status and the provider's error text, never the key.
- The calls are counted in the CallStore the runtime gives (`calls=`: the state
  backend's, shared by every agent and replica and reopenable with `/loop reopen`), else
  in a CallLoopGuard of the agent's own (`call_guard=`); either way each call is decided
  under the room's call-loop policy, so a `/loop set` takes effect on the next call and
  keeps the calls already counted in the window. The session is the room
  (`platform:channel`, plus `:thread` in a thread), so one looping room never pauses
  another.
- A call refused with `loop_detected` ends the turn with a short notice. While the circuit
  stays paused (`loop_paused`) a human still gets a short notice, a bot gets silence, so
  the notices themselves cannot feed a bot-to-bot loop.
- Shadow mode (DESIGN.md §5): with `tool_loop.mode: shadow` every tool call runs under the
  same LoopGuard and its verdict is on the `ToolCall` (`shadow=True`), but nothing is
  blocked, annotated or halted; with `call_loop.mode: shadow` a model call the CallStore
  refuses is sent anyway (the store's state is what enforce mode would leave: the
  refused call is not counted, a pause opens) and the refusal is in `AgentResult.shadowed`;
  under `policy.spend` such a call holds its estimate like an admitted one, so a guard in
  shadow never lets calls past a budget (issue 20).
- `stream: true` asks for a streamed completion (`gateway.agents.completion_stream`)
  where the platform edits messages (`turn.stream`, gateway.delivery.streaming; elsewhere the
  request is not streamed and the reply is sent whole). Every round is streamed and its
  tool-call deltas are assembled, so tools work as without streaming; each request starts
  the stream afresh (`restart`), so a round that ends in tool calls, or an attempt that is
  retried, leaves no text of its own: the next round's text replaces it in the same
  message. A stream is bounded by `timeout` between two reads, not in total (the turn
  timeout bounds the whole turn); a stream cut short is retried like a dropped connection.
- Spend (`policy.spend`, `gateway.agents.spend`): each request is admitted by the room's budget
  and the call guard in one step (`CallStore.admit`), through the guarded call's admission
  the proxy uses too (`gateway.proxy.guarded`); a refused one is never sent and
  ends the turn with `halt=Halt("spend", "budget_exceeded")`, the room's humans getting
  one notice per period and bots nothing. A sent request is charged what its usage block
  says (streams ask for it), a failed one nothing.
- The request log (`request_log`, the gateway's `gateway.proxy.request_log.RequestLog` on
  its CallStore): every attempt, sent or refused, is one entry under the agent's name,
  with the room (and thread) as its session, the guard's circuit, `fields` {room, bot}
  (the budget's; not fields rules read), and the attempt's number (0 first) as `retry`.
  A sent call has the tokens its usage block reports (streams always ask for it), priced
  as the proxy prices them; a refused one (`budget_exceeded`, or the call guard's code)
  the proxy's estimate; a failed one (`upstream_error`, with the status when there was
  an answer) no tokens and no cost, as the budget charges it nothing.
- Tracing (`gateway.observability.tracing`): each attempt is a `chat` span (its request
  carries the span's `traceparent`), each tool call an `execute_tool` span with
  LoopGuard's action and code on it.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import json
import logging
import math
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential

from gateway.agents.completion_stream import CompletionStreamError, read_completion
from gateway.agents.python_fn import import_callable
from gateway.agents.spend import PROVIDER, AgentBudgets, CallCharge, reported_usage
from gateway.app import messages
from gateway.app.errors import ConfigError, LoopwardenError
from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.app.types import AgentResult, Halt, HistoryEntry, ToolCall
from gateway.calls.budgets import Amount, SpendHold
from gateway.calls.store import ENFORCED, CallStore, MemoryCallStore, ShadowGuards
from gateway.config import OpenAIAgentConfig, SpendSettings
from gateway.observability import tracing
from gateway.proxy.guarded import Admitted, GuardedCalls, OverBudget
from gateway.proxy.provider import Usage
from gateway.proxy.request_log import RequestLog
from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    circuit_key,
    fingerprint_call,
    is_provider_failure,
)
from guards.loop_guard import GuardAction, LoopGuard, LoopGuardDecision
from guards.tool_wrapper import guarded_call, settling_decision

if TYPE_CHECKING:
    from gateway.agents.mcp import McpTool, McpToolbox
    from gateway.app.context import TurnContext
    from gateway.delivery.streaming import ReplyStream
    from gateway.state.base import DecisionStore

log = logging.getLogger("loopwarden.agents.openai")

Sleep = Callable[[float], Awaitable[None]]
SessionFactory = Callable[[], aiohttp.ClientSession]
WireMessage = dict[str, object]
"""One chat message as sent on the wire (OpenAI JSON)."""


# bool before int: issubclass(bool, int) is true, and a flag is not a number.
_JSON_TYPES: Mapping[type, str] = {
    bool: "boolean",
    str: "string",
    int: "integer",
    float: "number",
    list: "array",
    tuple: "array",
    dict: "object",
}
_ERROR_DETAIL_MAX = 300
_NOTHING_USED = Usage(0, 0)
_NO_RULE_FIELDS: Mapping[str, str] = {}  # the agents' calls meet the circuit alone, no rules
_CALL_LOOP_SHADOW = ShadowGuards(circuit=True)


class _WireModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _WireFunction(_WireModel):
    name: str
    arguments: str = "{}"


class _WireToolCall(_WireModel):
    id: str
    type: str = "function"
    function: _WireFunction


class _WireMessage(_WireModel):
    content: str | None = None
    tool_calls: tuple[_WireToolCall, ...] | None = None


class _WireChoice(_WireModel):
    message: _WireMessage


class _Completion(_WireModel):
    """The part of a chat-completions response the agent reads (`usage` as it came)."""

    choices: tuple[_WireChoice, ...]
    usage: object = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A Python callable offered to the model as a JSON-schema function tool."""

    name: str
    function: Callable[..., object]
    description: str
    parameters: Mapping[str, object]

    def to_wire(self) -> WireMessage:
        """The `tools` entry of a chat-completions request."""
        return function_tool(self.name, self.description, self.parameters)

    async def call(self, arguments: dict[str, object]) -> object:
        """Run the function (a sync one in a worker thread) with the model's arguments."""
        if inspect.iscoroutinefunction(self.function):
            result: object = await self.function(**arguments)
        else:
            result = await asyncio.to_thread(self.function, **arguments)
        return result


def function_tool(name: str, description: str, parameters: Mapping[str, object]) -> WireMessage:
    """One `tools` entry of a chat-completions request: a function and its JSON schema."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def json_type(annotation: object) -> str | None:
    """The JSON-schema type of a parameter annotation (None: any type)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return json_type(members[0]) if len(members) == 1 else None
    target = annotation if origin is None else origin
    if isinstance(target, type):
        for python_type, name in _JSON_TYPES.items():
            if issubclass(target, python_type):
                return name
    return None


def tool_spec(function: Callable[..., object], name: str | None = None) -> ToolSpec:
    """Describe a callable from its signature: annotations → JSON types, docstring → description.

    The tool is named `name`, else the function's `__name__`.
    """
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError):
        hints = {}  # an annotation that cannot be resolved: its parameter takes any type
    properties: dict[str, object] = {}
    required: list[str] = []
    for param, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = json_type(hints[param]) if param in hints else None
        properties[param] = {"type": kind} if kind else {}
        if parameter.default is parameter.empty:
            required.append(param)
    tool_name = name or str(getattr(function, "__name__", "tool"))
    doc = (inspect.getdoc(function) or "").strip()
    return ToolSpec(
        name=tool_name,
        function=function,
        description=doc.splitlines()[0] if doc else tool_name,
        parameters={"type": "object", "properties": properties, "required": required},
    )


def load_tools(agent_name: str, refs: Sequence[str]) -> dict[str, ToolSpec]:
    """Import and describe the configured tools; a bad one is a ConfigError naming it."""
    tools: dict[str, ToolSpec] = {}
    for index, ref in enumerate(refs):
        field = f"agents.{agent_name}.tools.{index}"
        spec = tool_spec(import_callable(ref, field=field), ref.partition(":")[2])
        if spec.name in tools:
            raise ConfigError(field, f"a tool named {spec.name!r} is already configured")
        tools[spec.name] = spec
    return tools


def mcp_toolbox(agent_name: str, config: OpenAIAgentConfig) -> McpToolbox | None:
    """The agent's MCP servers (None without any); only then is the `mcp` extra needed."""
    if not config.mcp_servers:
        return None
    try:
        from gateway.agents.mcp import McpToolbox
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"agents.{agent_name}.mcp_servers",
            f"MCP servers need the {exc.name} package: pip install 'loopwarden[mcp]'",
        ) from None
    return McpToolbox(agent_name, config.mcp_servers)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


class _ProviderError(LoopwardenError):
    """A model call that failed: HTTP status (None: no answer), reason, Retry-After."""

    def __init__(self, status: int | None, reason: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {reason}" if status is not None else reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.transient = is_provider_failure(status, reason) and reason != "invalid response"


@dataclass(frozen=True, slots=True)
class _TurnSpend:
    """A turn under `policy.spend`: its group's fields, the notice's claim, shadow's refusals."""

    settings: SpendSettings
    fields: Mapping[str, str]
    state: DecisionStore
    room: str
    sender_is_bot: bool
    waived: list[Halt]


@dataclass(frozen=True, slots=True)
class _ModelCall:
    """One request to the model as the request log reads it (a `LoggedRequest`)."""

    agent: str
    session: str
    circuit: str
    model: str
    fields: Mapping[str, str]
    fingerprint: str = ""
    request_bytes: int = 0
    retry: int = 0
    started: float = 0.0
    provider_name: str = PROVIDER
    max_output: int | None = None  # the agents send no max_tokens


class _TurnEnded(LoopwardenError):
    """Ends the turn early with this reply (None: silence), and the guard's halt if any."""

    def __init__(self, text: str | None, *, halt: Halt | None) -> None:
        super().__init__(text or "")
        self.text = text
        self.halt = halt


class OpenAIAgent:
    """Answers a turn with an OpenAI-compatible model and guarded Python tools."""

    def __init__(
        self,
        name: str,
        config: OpenAIAgentConfig,
        *,
        session_factory: SessionFactory = aiohttp.ClientSession,
        call_guard: CallLoopGuard | None = None,
        calls: CallStore | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] | None = None,
        max_attempts: int = 4,
        max_retry_wait: float = 30.0,
        mcp: McpToolbox | None = None,
        budgets: AgentBudgets | None = None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        self._tools = load_tools(name, config.tools)
        self._wire_tools = [spec.to_wire() for spec in self._tools.values()]
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self.calls = calls if calls is not None else MemoryCallStore(guard=call_guard)
        self._sleep = sleep
        self._clock = clock
        self._max_attempts = max_attempts
        self._max_retry_wait = max_retry_wait
        self._secret = config.api_key.get_secret_value() if config.api_key else ""
        self._mcp = mcp if mcp is not None else mcp_toolbox(name, config)
        self._budgets = budgets if budgets is not None else AgentBudgets()
        # Admission, the shadow waiver and the request log, as in the proxy (None: no log).
        self._guarded = GuardedCalls(self.calls, request_log, log=log)

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """The tools offered to the model, by name."""
        return self._tools

    async def respond(self, turn: TurnContext) -> AgentResult:
        """Run the tool-calling loop for one message; guard stops become short replies."""
        msg = turn.message
        session = msg.room if msg.thread_id is None else f"{msg.room}:{msg.thread_id}"
        circuit = circuit_key(self.name, session)
        resolved = turn.resolved
        guard = LoopGuard(resolved.tool_loop, clock=self._clock)
        remote = await self._mcp_tools()
        for tool in remote.values():
            guard.register_tool(tool.wire_name, idempotent=tool.idempotent)
        offered = self._wire_tools + [
            function_tool(tool.wire_name, tool.description, tool.parameters)
            for tool in remote.values()
        ]
        policy = resolved.call_loop
        tool_shadow = resolved.tool_loop_shadow
        shadowed: list[Halt] = []  # the call guard's refusals shadow mode let through
        call_shadow = shadowed if resolved.call_loop_shadow else None
        fields = {"room": msg.room, "bot": turn.bot.id}
        model_call = _ModelCall(self.name, session, circuit, self._config.model, fields)
        settings = resolved.policy.spend
        spend = (
            None
            if settings is None
            else _TurnSpend(
                settings,
                fields,
                turn.state,
                msg.room,
                msg.sender_is_bot,
                shadowed,
            )
        )
        conversation: list[WireMessage] = []
        if self._config.system_prompt:
            conversation.append({"role": "system", "content": self._config.system_prompt})
        conversation.extend(_history_message(entry) for entry in turn.history)
        conversation.append({"role": "user", "content": f"{msg.sender_name}: {msg.text}"})
        calls: list[ToolCall] = []
        rounds = self._config.max_tool_rounds
        stream = turn.stream if self._config.stream else None
        if stream is not None:
            stream.begin(self._config.stream_edit_seconds)
        try:
            for round_no in range(rounds + 1):
                answer = await self._complete(
                    model_call,
                    policy,
                    conversation,
                    offered,
                    sender_is_bot=msg.sender_is_bot,
                    stream=stream,
                    shadowed=call_shadow,
                    spend=spend,
                )
                if not answer.tool_calls:
                    return AgentResult(
                        text=answer.content, tool_calls=tuple(calls), shadowed=tuple(shadowed)
                    )
                if round_no == rounds:
                    break
                conversation.append(_assistant_message(answer))
                for call in answer.tool_calls:
                    conversation.append(
                        await self._run_tool(guard, call, calls, remote, shadow=tool_shadow)
                    )
        except _TurnEnded as ended:
            return AgentResult(
                text=ended.text, tool_calls=tuple(calls), halt=ended.halt, shadowed=tuple(shadowed)
            )
        log.info("agent %s: stopped after %d tool rounds", self.name, rounds)
        text = messages.TOO_MANY_ROUNDS.format(rounds=rounds)
        return AgentResult(
            text=text,
            tool_calls=tuple(calls),
            halt=Halt("agent", "max_tool_rounds"),
            shadowed=tuple(shadowed),
        )

    async def aclose(self) -> None:
        """Close the HTTP session and the MCP servers (a later turn opens them again)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        if self._mcp is not None:
            await self._mcp.aclose()

    @property
    def mcp(self) -> McpToolbox | None:
        """The agent's MCP servers, None without any."""
        return self._mcp

    async def start(self) -> None:
        """Connect the MCP servers when the gateway starts (a failure is retried in the back)."""
        if self._mcp is not None:
            await self._mcp.start()

    async def _mcp_tools(self) -> dict[str, McpTool]:
        """The MCP tools of the servers connected now (started with the gateway, or here)."""
        if self._mcp is None:
            return {}
        await self._mcp.start()
        return self._mcp.tools()

    async def _run_tool(
        self,
        guard: LoopGuard,
        call: _WireToolCall,
        calls: list[ToolCall],
        remote: Mapping[str, McpTool],
        *,
        shadow: bool,
    ) -> WireMessage:
        """Run one tool call under the turn's LoopGuard; the tool message for the model.

        With `shadow` (`tool_loop.mode: shadow`) the guard's verdicts are recorded on the
        ToolCall and acted on not at all: the model gets the tool's own result.
        """
        name = call.function.name
        raw_args = call.function.arguments
        args = _parse_arguments(raw_args)
        spec = self._tools.get(name)
        mcp_tool = remote.get(name)
        invoke = spec.call if spec is not None else mcp_tool.call if mcp_tool is not None else None
        timeout = self._config.timeout

        async def run(**kwargs: object) -> object:
            if invoke is None:
                known = ", ".join([*self._tools, *remote]) or "none"
                raise LookupError(f"unknown tool {name!r} (available: {known})")
            if not isinstance(args, dict):
                raise TypeError(f"arguments must be a JSON object, got {raw_args!r}")
            async with asyncio.timeout(timeout):
                return await invoke(kwargs)

        guard_args: dict[str, object] = args if isinstance(args, dict) else {"_raw": raw_args}
        decisions: list[LoopGuardDecision] = []  # the guard's, for the ToolCall record
        with _tool_span(name, call.id, remote=mcp_tool is not None) as span:
            try:
                result = await guarded_call(
                    guard, name, run, guard_args, on_decision=decisions.append, shadow=shadow
                )
            except Exception as exc:
                verdict = settling_decision(decisions)
                calls.append(_tool_call(name, raw_args, verdict, shadow=shadow))
                _traced_verdict(span, verdict, failed=type(exc).__name__)
                if not shadow and verdict is not None and verdict.action is GuardAction.HALT:
                    raise self._halt(verdict, name) from exc
                result = {"error": _failure_text(exc)}
            else:
                verdict = settling_decision(decisions)
                calls.append(_tool_call(name, raw_args, verdict, shadow=shadow))
                _traced_verdict(span, verdict, failed=None)
        return {"role": "tool", "tool_call_id": call.id, "content": _tool_content(result)}

    def _halt(self, verdict: LoopGuardDecision, tool: str) -> _TurnEnded:
        """The turn's end after a LoopGuard HALT: a short message naming what went wrong."""
        log.info("agent %s: tool loop halted at %s (%s)", self.name, tool, verdict.code)
        halt = Halt("tool_loop", verdict.code)
        if verdict.code == "time_exceeded":
            return _TurnEnded(messages.TURN_TOO_LONG, halt=halt)
        return _TurnEnded(messages.TOOL_LOOP_STOP.format(tool=tool), halt=halt)

    async def _complete(
        self,
        model_call: _ModelCall,
        policy: CallLoopPolicy,
        conversation: list[WireMessage],
        tools: list[WireMessage],
        *,
        sender_is_bot: bool,
        stream: ReplyStream | None = None,
        shadowed: list[Halt] | None = None,
        spend: _TurnSpend | None = None,
    ) -> _WireMessage:
        """One model answer, retried on provider failures; guard refusals end the turn.

        `shadowed` is given when the call guard is in shadow mode: a call it refuses is
        sent anyway, and the refusal is added to that list instead of ending the turn.
        `spend` is the room's budget, when it has one.
        """
        payload: dict[str, object] = {"model": self._config.model, "messages": conversation}
        if tools:
            payload["tools"] = tools
        if self._config.temperature is not None:
            payload["temperature"] = self._config.temperature
        if stream is not None:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        call = replace(
            model_call,
            fingerprint=fingerprint_call(self._config.model, conversation),
            request_bytes=len(json.dumps(payload).encode()),
        )
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=self._wait,
            retry=retry_if_exception(self._should_retry),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    completion = await self._attempt(
                        replace(call, retry=attempt.retry_state.attempt_number - 1),
                        policy,
                        payload,
                        sender_is_bot,
                        stream=stream,
                        shadowed=shadowed,
                        spend=spend,
                    )
        except _ProviderError as exc:
            log.warning(
                "agent %s: model call to %s failed: %s",
                self.name,
                self._url,
                self._redact(str(exc)),
            )
            raise _TurnEnded(messages.PROVIDER_DOWN, halt=None) from None
        if not completion.choices:
            log.warning("agent %s: model answered with no choices", self.name)
            raise _TurnEnded(messages.PROVIDER_DOWN, halt=None)
        return completion.choices[0].message

    async def _attempt(
        self,
        call: _ModelCall,
        policy: CallLoopPolicy,
        payload: Mapping[str, object],
        sender_is_bot: bool,
        *,
        stream: ReplyStream | None,
        shadowed: list[Halt] | None,
        spend: _TurnSpend | None,
    ) -> _Completion:
        """One HTTP request, if budget and call guard allow it; a failure is uncounted and free.

        Every attempt is logged, sent or refused.
        """
        guarded = self._guarded
        if guarded.request_log is not None:
            call = replace(call, started=guarded.request_log.started())
        with guarded.chat(call):
            return await self._send(
                call, policy, payload, sender_is_bot, stream=stream, shadowed=shadowed, spend=spend
            )

    async def _send(
        self,
        call: _ModelCall,
        policy: CallLoopPolicy,
        payload: Mapping[str, object],
        sender_is_bot: bool,
        *,
        stream: ReplyStream | None,
        shadowed: list[Halt] | None,
        spend: _TurnSpend | None,
    ) -> _Completion:
        """`_attempt` inside the call's `chat` span: admit, then post, log and charge."""
        guarded = self._guarded
        admitted, charge = await self._admit(call, policy, spend, shadow=shadowed is not None)
        decision = admitted.decision
        if not admitted.sent:
            guarded.refused(call, decision)
            raise self._refused(decision, sender_is_bot=sender_is_bot)
        if shadowed is not None and admitted.waived:
            shadowed.append(Halt("call_loop", decision.code))
        try:
            completion, status = await self._post(payload, stream)
        except _ProviderError as exc:
            guarded.record(call, "upstream_error", exc.status, _NOTHING_USED)
            await self.calls.record_outcome(decision, exc.status, exc.reason)
            if charge is not None:
                await self.calls.charge(charge.hold, None)
            raise
        guarded.record(call, "forwarded", status, reported_usage(completion.usage))
        if charge is not None:
            await self.calls.charge(charge.hold, self._budgets.used(charge, completion.usage))
        return completion

    async def _admit(
        self, call: _ModelCall, policy: CallLoopPolicy, spend: _TurnSpend | None, *, shadow: bool
    ) -> tuple[Admitted, CallCharge | None]:
        """The guarded call's admission and, under a budget, what the call holds.

        A call the budget refuses ends the turn (in shadow mode it goes on, holding
        nothing). One the call guard refuses holds nothing either (the store gave it
        back), unless its shadow mode (`shadow`) waives the refusal: then it is sent,
        holding its estimate like an admitted call (issue 20).
        """
        guards = _CALL_LOOP_SHADOW if shadow else ENFORCED
        if spend is None:
            admitted = await self._guarded.decide(
                call, rule_fields=_NO_RULE_FIELDS, policy=policy, shadow=guards
            )
            return admitted, None
        settings = spend.settings
        event, charge = self._budgets.event(settings, spend.fields, call.model, call.request_bytes)
        admission = await self._guarded.admit(
            call,
            event,
            rule_fields=_NO_RULE_FIELDS,
            policy=policy,
            shadow=guards,
            budget_shadow=settings.mode == "shadow",
        )
        verdict = admission.spend
        if isinstance(admission, Admitted) and verdict.allowed:
            return admission, charge
        group = verdict.refused or event.groups[0]  # the call's one group
        halt = self._budgets.refusal(verdict, group, settings)
        if isinstance(admission, OverBudget):
            self._guarded.refused(call, None, unavailable=verdict.unavailable)
            notice = (
                None
                if spend.sender_is_bot
                else await self._budgets.notice(
                    verdict, group, settings, state=spend.state, room=spend.room
                )
            )
            raise _TurnEnded(notice, halt=halt)
        log.info(
            "agent %s: shadow: would have refused the model call (%s) on %s",
            self.name,
            halt.code,
            call.circuit,
            extra={"decision": halt.code, "shadow": "true"},
        )
        spend.waived.append(halt)
        return admission, replace(charge, hold=SpendHold(event.groups, Amount()))

    def _refused(self, decision: CallDecision, *, sender_is_bot: bool) -> _TurnEnded:
        """The turn's end when the call guard refuses a model call."""
        log.warning(
            "agent %s: model call refused (%s) on %s, %d identical calls, %.0f s left",
            self.name,
            decision.code,
            decision.circuit,
            decision.count,
            decision.retry_after,
        )
        pause = messages.format_duration(decision.retry_after)
        halt = Halt("call_loop", decision.code)
        if decision.code == "loop_detected":
            return _TurnEnded(messages.CALL_LOOP_STOP.format(pause=pause), halt=halt)
        text = None if sender_is_bot else messages.CALL_PAUSED.format(pause=pause)
        return _TurnEnded(text, halt=halt)

    def _client(self) -> aiohttp.ClientSession:
        """The agent's one HTTP session, created on first use (it needs a running loop)."""
        if self._session is None or self._session.closed:
            self._session = self._session_factory()
        return self._session

    async def _post(
        self, payload: Mapping[str, object], stream: ReplyStream | None = None
    ) -> tuple[_Completion, int]:
        """POST /chat/completions, its answer and status; failures raise _ProviderError.

        With `stream` the answer is read as it comes, its text written into `stream`.
        """
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        tracing.tracer().inject(headers)  # the call's `chat` span, tracing on
        limit = self._config.timeout
        timeout = (
            aiohttp.ClientTimeout(total=limit)
            if stream is None
            else aiohttp.ClientTimeout(sock_connect=limit, sock_read=limit)
        )
        try:
            async with self._client().post(
                self._url, json=payload, headers=headers, timeout=timeout
            ) as response:
                status = response.status
                if status >= 400:
                    detail = _error_detail(await response.text())
                    retry_after = parse_retry_after(response.headers)
                    raise _ProviderError(status, detail, retry_after)
                if stream is None:
                    body = parse_json(await response.read())
                else:
                    stream.restart()
                    body = await read_completion(response.content, stream.write)
        except TimeoutError:
            raise _ProviderError(None, "timeout") from None
        except aiohttp.ClientError as exc:
            raise _ProviderError(None, f"connection failed ({type(exc).__name__})") from None
        except CompletionStreamError as exc:
            reason = "stream cut short" if exc.retryable else "invalid response"
            log.info("agent %s: streamed answer unreadable: %s", self.name, self._redact(str(exc)))
            raise _ProviderError(None, reason) from None
        except ValueError:
            raise _ProviderError(None, "invalid response") from None
        try:
            return _Completion.model_validate(body), status
        except ValidationError:
            raise _ProviderError(None, "invalid response") from None

    def _should_retry(self, exc: BaseException) -> bool:
        """Retry provider failures, unless asked to wait longer than we are willing to."""
        if not isinstance(exc, _ProviderError) or not exc.transient:
            return False
        return exc.retry_after is None or exc.retry_after <= self._max_retry_wait

    def _wait(self, state: RetryCallState) -> float:
        """Retry-After when the provider gave one, else exponential backoff."""
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, _ProviderError) and exc.retry_after is not None:
            return exc.retry_after
        return float(wait_exponential(multiplier=0.5, max=8)(state))

    def _redact(self, text: str) -> str:
        """Text with the API key masked, should a provider ever echo it."""
        return text.replace(self._secret, "***") if self._secret else text


def _parse_arguments(raw: str) -> object:
    """The model's JSON arguments; None when they are not JSON (the call then fails)."""
    try:
        return parse_json(raw) if raw.strip() else {}
    except JsonBodyError:
        return None


def _history_message(entry: HistoryEntry) -> WireMessage:
    """An earlier message of the room: the bot's own as it said it, another's as "Name: text"."""
    if entry.role == "assistant":
        return {"role": "assistant", "content": entry.text}
    return {"role": "user", "content": f"{entry.name}: {entry.text}"}


def _assistant_message(answer: _WireMessage) -> WireMessage:
    """The assistant's tool-call message, echoed back so tool results can refer to it."""
    return {
        "role": "assistant",
        "content": answer.content,
        "tool_calls": [call.model_dump() for call in answer.tool_calls or ()],
    }


def _tool_call(
    name: str, arguments: str, verdict: LoopGuardDecision | None, *, shadow: bool
) -> ToolCall:
    """The record of one tool call with the guard's verdict (`shadow`: not acted on)."""
    if verdict is None:
        return ToolCall(name, arguments, GuardAction.ALLOW.value, "ok", shadow)
    return ToolCall(name, arguments, verdict.action.value, verdict.code, shadow)


def _failure_text(exc: Exception) -> str:
    """A failed tool call as the model sees it, with any loop-guard note attached."""
    notes = " ".join(getattr(exc, "__notes__", ()))
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} {notes}" if notes else text


def _tool_content(result: object) -> str:
    """A tool result as the text of a tool message: strings as they are, the rest as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, default=str)


def _error_detail(text: str) -> str:
    """The provider's error message from an error body, shortened for the log."""
    try:
        body = parse_json(text)
    except JsonBodyError:
        return text[:_ERROR_DETAIL_MAX]
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message if message is not None else text)[:_ERROR_DETAIL_MAX]


def _tool_span(name: str, call_id: str, *, remote: bool) -> AbstractContextManager[tracing.Span]:
    """The `execute_tool` span of one tool call (an MCP server's tool is an `extension`)."""
    tracer = tracing.tracer()
    if not tracer.enabled:
        return tracing.NO_SPAN
    attributes: dict[str, tracing.AttributeValue] = {
        tracing.OPERATION_NAME: tracing.EXECUTE_TOOL,
        tracing.TOOL_NAME: name,
        tracing.TOOL_CALL_ID: call_id,
        tracing.TOOL_TYPE: "extension" if remote else "function",
    }
    return tracer.span(f"{tracing.EXECUTE_TOOL} {name}", attributes)


def _traced_verdict(
    span: tracing.Span, verdict: LoopGuardDecision | None, *, failed: str | None
) -> None:
    """LoopGuard's verdict on the call, and the tool's failure, on its `execute_tool` span."""
    if verdict is not None:
        span.set_attribute(tracing.TOOL_ACTION, verdict.action.value)
        span.set_attribute(tracing.TOOL_CODE, verdict.code)
    if failed is not None:
        span.set_error(failed)
