"""Every user-facing string the gateway posts in a room, kept in one module.

Refusals name no config key, no admin id and neither of the words that would tell a
stranger how access is granted; notices are one short line. Durations are written for
people ("90 s", "10 min", "2 h 5 min"), never as raw floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from gateway.config import Policy
from guards.call_loop import PausedCircuit

REFUSAL = "Sorry, you can't run loop commands here."
NO_CALL_GUARD = "No LLM-call circuits are kept here."
SILENCE_NOTICE = "(nothing to add)"
STATUS_DEGRADED = (
    "State: the shared store is unreachable; budgets and cooldowns are local to this "
    "process until it is back"
)
TIMEOUT_NOTICE = "Sorry, that took too long to answer, so I gave up on it."

# The openai agent's short messages when a guard or a limit ends its turn early.
TOOL_LOOP_STOP = "I stopped: I was calling {tool} over and over without progress."
TURN_TOO_LONG = "I stopped: this took longer than I'm allowed to spend on one answer."
TOO_MANY_ROUNDS = "I stopped: I used {rounds} rounds of tool calls without finishing."
CALL_LOOP_STOP = (
    "I stopped: I kept sending my model the same request, so I'm pausing here for {pause}."
)
CALL_PAUSED = "I'm paused in this conversation for another {pause} after repeating myself."
PROVIDER_DOWN = "Sorry, I couldn't reach my model just now. Please try again in a moment."
# The http agent's notice when its service fails, times out or answers something unreadable.
HTTP_AGENT_DOWN = "Sorry, I couldn't get an answer from my service just now. Please try again."


def format_duration(seconds: float) -> str:
    """A short human duration: `45 s`, `10 min`, `1 min 30 s`, `2 h 5 min`, `1 d 3 h`."""
    if math.isinf(seconds):
        return "until resumed"
    total = max(0, math.ceil(seconds))
    if total < 60:
        return f"{total} s"
    units = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        amount, total = divmod(total, size)
        if amount:
            parts.append(f"{amount} {name}")
        if len(parts) == 2:
            break
    return " ".join(parts)


def cooldown_notice(
    a: str, b: str, *, cooldown: float, budget: int, window: float, prefix: str | None
) -> str:
    """Posted once per cooldown when a bot pair goes quiet.

    `prefix` None leaves out the admin command (what `loopwarden_integrations.RoomGuard` posts).
    """
    pause = pair_cooldown_notice(a, b, cooldown=cooldown, budget=budget, window=window)
    return pause if prefix is None else f"{pause} An admin can {prefix} reset."


def pair_cooldown_notice(a: str, b: str, *, cooldown: float, budget: int, window: float) -> str:
    """The cooldown notice without an admin command (`cooldown_notice` without a prefix)."""
    return (
        f"Loop guard: pausing replies between {a} and {b} for {format_duration(cooldown)} "
        f"({budget} bot messages in {format_duration(window)})."
    )


# A room's notice names at most this many bots, then "and N more".
_NAMED_BOTS = 6


def bot_names(bots: Sequence[str]) -> str:
    """`A`, `A and B`, `A, B and C`, `A, B, …, F and 3 more`: the bots a room notice names."""
    shown = list(bots[:_NAMED_BOTS])
    more = len(bots) - len(shown)
    if more:
        shown.append(f"{more} more")
    if len(shown) < 2:
        return "".join(shown)
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def room_cooldown_notice(
    bots: Sequence[str], *, cooldown: float, budget: int, window: float, prefix: str | None
) -> str:
    """Posted once per room cooldown (issue 20): the bots whose messages filled the budget.

    `prefix` None leaves out the admin command (what `loopwarden_integrations.RoomGuard` posts).
    """
    text = (
        f"Loop guard: pausing replies to bots in this room for {format_duration(cooldown)} "
        f"({budget} bot messages in {format_duration(window)} from {bot_names(bots)})."
    )
    return text if prefix is None else f"{text} An admin can {prefix} reset."


# Why admission or the bot-loop guard refused a message, as `status` lists it.
def paused_detail(left: float) -> str:
    """A message in a paused room."""
    return f"room paused, {format_duration(left)} left"


def answers_none_detail(kind: str) -> str:
    """A sender `respond_to` turns away (`kind`: humans or bots)."""
    return f"this room answers no {kind}"


def must_mention_detail(kind: str) -> str:
    """A sender who must mention the bot and did not."""
    return f"{kind} must mention the bot here"


def bot_turn_cap_detail(turns: int, cap: int) -> str:
    """A bot message beyond the consecutive-bot-turn cap."""
    return f"{turns} bot turns in a row, cap {cap}; a human message resets it"


def budget_exceeded_detail(event: int, budget: int, *, window: float, cooldown: float) -> str:
    """The bot message that exceeded its pair's budget and opened the cooldown."""
    return (
        f"event {event} over {budget} per {format_duration(window)}, "
        f"cooldown {format_duration(cooldown)}"
    )


def cooling_down_detail(left: float) -> str:
    """A bot message of a pair in cooldown."""
    return f"cooling down, {format_duration(left)} left"


def room_budget_exceeded_detail(
    event: int, budget: int, *, window: float, cooldown: float, bots: Sequence[str]
) -> str:
    """The bot message that exceeded its room's budget (whatever the pair) and opened it."""
    return (
        f"room: bot message {event} over {budget} per {format_duration(window)} "
        f"from {bot_names(bots)}, cooldown {format_duration(cooldown)}"
    )


def room_cooling_down_detail(left: float) -> str:
    """A bot message in a room whose room budget is cooling down."""
    return f"room cooling down, {format_duration(left)} left"


# What a guard in shadow mode would have refused, as the decision log says it.
SHADOW_CALL_DETAIL = "the model call was sent anyway"


def shadow_tool_detail(action: str, tool: str) -> str:
    """A tool call the tool-call guard in shadow mode would have blocked or halted."""
    return f"{action} of {tool}; the call ran anyway"


def help_text(prefix: str) -> str:
    """The list of loop commands, with the prefix the platform allows (`/loop` or `!loop`)."""
    return "\n".join(
        (
            "Loop guard commands:",
            f"{prefix} status - this room's policy, bot pairs, pause and recent refusals",
            f"{prefix} reset - clear this room's bot-pair budgets and bot-turn count",
            f"{prefix} reset all - clear the bot-pair budgets of every room",
            f"{prefix} reset <bot> - clear one bot's pair budgets everywhere",
            f"{prefix} pause [30s|10m|2h|1d] - stop answering here (no duration: until resume)",
            f"{prefix} resume - end a pause",
            f"{prefix} set <field> <value> - change this room's policy, "
            f"e.g. {prefix} set bot_loop.max_events_per_window 6",
            f"{prefix} policy - show this room's effective policy",
            f"{prefix} forget - empty this room's (or thread's) memory for every bot",
            f"{prefix} circuits - LLM-call circuits paused after a likely loop",
            f"{prefix} reopen <circuit> - lift a circuit's pause before it ends",
            f"{prefix} spend - what this room's agents spent of their budget this period",
            f"{prefix} help - this list",
        )
    )


def forget_ack(dropped: int, *, thread: bool) -> str:
    """Acknowledges `forget` (or `/new` in a DM): the conversation's memory is emptied."""
    where = "this thread's conversation" if thread else "this conversation"
    noun = "message" if dropped == 1 else "messages"
    return f"Forgot {where} ({dropped} {noun}); the bots start afresh from here."


def reset_room_ack(pairs: int) -> str:
    """Acknowledges `reset` in one room."""
    return f"Loop guard reset for this room: {_pairs(pairs)} cleared, bot-turn count back to 0."


def reset_all_ack(pairs: int) -> str:
    """Acknowledges `reset all`."""
    return f"Loop guard reset everywhere: {_pairs(pairs)} cleared."


def reset_bot_ack(bot: str, pairs: int) -> str:
    """Acknowledges `reset <bot>`."""
    return f"Loop guard reset for {bot}: {_pairs(pairs)} cleared."


def pause_ack(seconds: float | None, prefix: str) -> str:
    """Acknowledges `pause`."""
    if seconds is None:
        return f"Paused: bots won't answer in this room until {prefix} resume."
    return (
        f"Paused: bots won't answer in this room for {format_duration(seconds)} "
        f"({prefix} resume ends it sooner)."
    )


def bad_duration(text: str) -> str:
    """Explains a `pause` duration that could not be read or is too long."""
    return (
        f"Can't pause for {text[:40]!r}: give a duration like 30s, 10m, 2h or 1d (at most "
        "366d), or none to pause until resumed."
    )


def resume_ack(was_paused: bool) -> str:
    """Acknowledges `resume`."""
    return "Resumed: bots answer in this room again." if was_paused else "This room wasn't paused."


def set_ack(field: str, value: object) -> str:
    """Acknowledges a stored `set`."""
    return f"Set {field} = {_yaml_value(value)} for this room."


def set_usage(prefix: str) -> str:
    """Explains how `set` is written."""
    return (
        f"Usage: {prefix} set <field> <value>, e.g. {prefix} set bot_loop.max_events_per_window 6"
    )


def set_refused(field: str, reason: str) -> str:
    """Explains why a `set` was not stored."""
    return f"Can't set {field}: {reason}. Nothing was changed."


NOT_FINITE = "not a finite number"
VALUE_SPACES = "the value starts or ends with whitespace; send it without"
LOOKALIKE_DIGITS = "write the number in plain digits 0-9 (this one has look-alike characters)"


def value_too_long(limit: int) -> str:
    """The reason for a `set` value longer than any field takes."""
    return f"the value is longer than {limit} characters"


def unknown_field(known: Sequence[str]) -> str:
    """The reason for a `set` on a field that does not exist."""
    return "no such field (try one of: " + ", ".join(known) + ")"


def circuits_text(paused: Sequence[PausedCircuit]) -> str:
    """The answer to `circuits`: each paused circuit with its time left and refusals."""
    if not paused:
        return "No LLM-call circuit is paused."
    lines = ["Paused LLM-call circuits:"]
    lines.extend(
        f"  {p.circuit}: {format_duration(p.remaining)} left, {p.reason}, "
        f"{p.count} call{'' if p.count == 1 else 's'} refused"
        for p in paused
    )
    return "\n".join(lines)


def reopen_ack(circuit: str, lifted: bool) -> str:
    """Acknowledges `reopen`."""
    if lifted:
        return f"Reopened {circuit}: its calls go through again, counted afresh."
    return f"{circuit} wasn't paused; its repeat counts start afresh."


def reopen_usage(prefix: str) -> str:
    """Explains how `reopen` is written."""
    return f"Usage: {prefix} reopen <circuit>, e.g. {prefix} reopen billing-bot/session=run-42"


def policy_text(room: str, policy: Policy) -> str:
    """The effective policy of a room as compact YAML in a code block."""
    body = yaml.safe_dump(
        policy.model_dump(mode="json"), sort_keys=False, default_flow_style=None, width=1000
    ).rstrip()
    return f"Effective policy for {room}:\n```yaml\n{body}\n```"


@dataclass(frozen=True, slots=True)
class PairLine:
    """One bot pair as `status` shows it (names already resolved)."""

    a: str
    b: str
    count: int
    cooldown_left: float


def spend_notice(*, per: Sequence[str], limit: str, ends: str) -> str:
    """Posted once per period to the humans of a room whose agents' budget is spent."""
    whose = "My" if "bot" in per else "This room's" if "room" in per else "The shared"
    return f"{whose} model budget for this period ({limit}) is used up; I answer again from {ends}."


SPEND_UNAVAILABLE = (
    "I can't check my model budget right now, so I'm not answering; please try again in a minute."
)
"""Posted to a room's humans when a model call was refused because its budget could not be
checked (the shared state is unreachable): nothing of the cause, which is the operator's."""


def spend_unavailable_detail(*, budget: str, retry_after: float) -> str:
    """Why a model call was refused for an unreachable budget, for the decision log."""
    return (
        f"budget {budget} could not be checked: the shared state is unreachable or its "
        f"replicas are behind (state.on_error: deny); retry in {format_duration(retry_after)}"
    )


def spend_refusal_detail(
    *, budget: str, group: str, spent: str | None, limit: str, ends: str, retry_after: float
) -> str:
    """Why a budget refused a model call, for the decision log and `status`."""
    figures = f"spent {spent} of {limit}" if spent is not None else f"limit {limit} reached"
    return f"budget {budget} {group}: {figures}; resets {ends}, in {format_duration(retry_after)}"


@dataclass(frozen=True, slots=True)
class SpendFigures:
    """One budget group as `spend` and `status` show it, in plain numbers."""

    group: str
    spent: str
    limit: str
    percent: float
    ends: str


def _spend_line(figures: SpendFigures) -> str:
    return (
        f"{figures.group}: {figures.spent} of {figures.limit} ({figures.percent:.1f}%), "
        f"period ends {figures.ends}"
    )


def spend_text(room: str, groups: Sequence[SpendFigures]) -> str:
    """The answer to `spend`: each group the room's agents are charged to."""
    if not groups:
        return f"No budget group applies to the agents in {room}."
    return "\n".join([f"Spend of the agents in {room} this period:", *map(_spend_line, groups)])


NO_SPEND_LIMIT = "This room's agents have no spend limit (policy.spend is not set)."
NO_SPEND_KEPT = "No spend is counted here."


def status_spend(groups: Sequence[SpendFigures]) -> str:
    """The `status` lines of the room's spend."""
    return "\n".join("Spend: " + _spend_line(figures) for figures in groups)


@dataclass(frozen=True, slots=True)
class RefusalLine:
    """One recent refusal as `status` shows it."""

    age: float
    stage: str
    code: str
    detail: str


def status_text(
    room: str,
    policy: Policy,
    *,
    paused: float | None,
    pairs: Sequence[PairLine],
    refusals: Sequence[RefusalLine],
    shadowed: Mapping[str, int],
    linked: Sequence[str] = (),
) -> str:
    """The answer to `status`: policy summary, shadow guards, pause, pairs, recent refusals.

    `shadowed` counts, per guard, what it would have refused here in shadow mode; `linked`
    are the other rooms of the room's link, named on a line of their own.
    """
    lines = [f"Loop status for {room}"]
    if linked:
        lines.append(f"Linked with: {', '.join(linked)} (one budget, pause and /loop commands)")
    lines.append("Policy: " + policy_summary(policy))
    lines.extend(
        f"{guard}: shadow: would have refused {shadowed.get(guard, 0)}"
        for guard in shadow_guards(policy)
    )
    if paused is None:
        lines.append("Paused: no")
    elif math.isinf(paused):
        lines.append("Paused: yes, until resumed")
    else:
        lines.append(f"Paused: yes, {format_duration(paused)} left")
    if pairs:
        lines.append("Bot pairs:")
        lines.extend(_pair_line(pair) for pair in pairs)
    else:
        lines.append("Bot pairs: none")
    if refusals:
        lines.append("Recent refusals:")
        lines.extend(
            f"  {format_duration(r.age)} ago: {r.stage} {r.code} ({r.detail})" for r in refusals
        )
    else:
        lines.append("Recent refusals: none")
    return "\n".join(lines)


def shadow_guards(policy: Policy) -> list[str]:
    """The guards of the policy that run in shadow mode, in pipeline order."""
    modes = {
        "bot_loop": policy.bot_loop.mode,
        "tool_loop": policy.tool_loop.mode,
        "call_loop": policy.call_loop.mode,
        "spend": policy.spend.mode if policy.spend is not None else "enforce",
    }
    return [guard for guard, mode in modes.items() if mode == "shadow"]


def policy_summary(policy: Policy) -> str:
    """One line: who is answered, the pair budget, the bot-turn cap, silence handling."""
    loop = policy.bot_loop
    respond = policy.respond_to
    guard = (
        f"pair budget {loop.max_events_per_window} per {format_duration(loop.window_seconds)}, "
        f"cooldown {format_duration(loop.cooldown_seconds)}, "
        f"bot-turn cap {loop.max_consecutive_bot_turns or 'off'}"
        if loop.enabled
        else "bot loop guard off"
    )
    silence = (
        f"silence tokens {', '.join(policy.silence.tokens)} "
        f"(addressed humans: {policy.silence.on_addressed_human_turn})"
        if policy.silence.enabled
        else "silence filter off"
    )
    return f"answers humans: {respond.humans}, bots: {respond.bots}; {guard}; {silence}"


def _pair_line(pair: PairLine) -> str:
    """`  a ↔ b: cooling down, 45 s left (20 in window)`: one pair's line of `status`."""
    if pair.cooldown_left > 0:
        left = format_duration(pair.cooldown_left)
        return f"  {pair.a} ↔ {pair.b}: cooling down, {left} left ({pair.count} in window)"
    return f"  {pair.a} ↔ {pair.b}: {pair.count} in window"


def _pairs(count: int) -> str:
    return f"{count} bot pair" + ("" if count == 1 else "s")


def _yaml_value(value: object) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000)
    return text.removesuffix("...\n").strip()
