"""Every user-facing string the proxy sends: error messages to clients and alert texts.

Error messages name the agent and session (never a key); alerts say what paused, why,
for how long, and how to reopen it early.
"""

from __future__ import annotations

from gateway.app.messages import format_duration

NOT_STARTED = "loopwarden: the proxy is not started."
UNKNOWN_KEY = (
    "loopwarden: missing or unknown proxy key (send a loopwarden proxy key as your SDK's api_key)."
)
NO_UPSTREAM = "loopwarden: this proxy has no {provider} upstream configured."
UPSTREAM_UNREACHABLE = (
    "loopwarden: the {provider} upstream could not be reached ({reason}); "
    "the call was not counted as a repeat."
)
BAD_PATH = (
    "loopwarden: path refused: {reason}. The proxy forwards only plainly spelled paths "
    "under the {provider} upstream."
)
BAD_BODY = "loopwarden: request body refused: {reason}."
BAD_FIELD = "loopwarden: request refused: {reason}."
UPSTREAM_UNREADABLE = (
    "loopwarden: the {provider} upstream answered with a body the proxy cannot check for "
    "keys ({reason}), so it was not relayed."
)
UPSTREAM_TIMEOUT = (
    "loopwarden: the {provider} upstream did not answer in time; "
    "the call was not counted as a repeat."
)


def refusal(message: str, *, code: str, agent: str, session: str) -> str:
    """A refused call's message: the guard's reason, the code, the agent and the session."""
    return f"{message} ({code}; agent {agent}, session {session or 'none'})"


def alert_subject(agent: str, code: str) -> str:
    """The subject line of an alert mail."""
    return f"loopwarden: {agent} paused ({code})"


def loop_alert(*, agent: str, session: str, circuit: str, count: int, pause: float) -> str:
    """The alert when a circuit pauses after repeating the same call."""
    return (
        f"loopwarden: agent {agent} looks stuck in a loop: {count} identical calls in session "
        f"{session or 'none'} (circuit {circuit}). Its calls are paused for "
        f"{format_duration(pause)}. Reopen early: loopwarden circuits reopen '{circuit}'"
    )


def rule_alert(*, agent: str, session: str, group: str, rule: str, count: int, pause: float) -> str:
    """The alert when a uniqueness rule pauses a group of calls."""
    return (
        f"loopwarden: rule {rule} paused {group} after {count} calls "
        f"(agent {agent}, session {session or 'none'}) for {format_duration(pause)}. "
        f"Reopen early: loopwarden circuits reopen '{group}'"
    )


def money(nano_usd: int | None, tokens: int | None) -> str:
    """A spend or limit in plain numbers: `$12.3400`, `150000 tokens`, or both."""
    parts = []
    if nano_usd is not None:
        parts.append(f"${nano_usd / 1e9:.4f}")
    if tokens is not None:
        parts.append(f"{tokens} tokens")
    return " and ".join(parts) or "-"


def budget_refusal(*, budget: str, group: str, limit: str, ends: str, unpriced: str | None) -> str:
    """A call refused by a budget: which budget and group, its limit, when it resets.

    It names no figure of another group (another customer's spend is not this client's).
    """
    if unpriced is not None:
        return (
            f"loopwarden: budget {budget} ({group}) is in dollars and model {unpriced!r} has "
            "no price, so the call was refused (proxy.unpriced: refuse)."
        )
    return (
        f"loopwarden: budget {budget} for {group} would be passed by this call "
        f"(limit {limit} this period); it resets at {ends}."
    )


def state_unavailable(*, budget: str, seconds: float) -> str:
    """A budgeted call refused while the shared state is down or its replicas lag behind
    `state.wait_replicas` (`state.on_error: deny`)."""
    return (
        f"loopwarden: budget {budget} cannot be checked: the proxy's shared state is "
        "unreachable or its replicas are behind (state.on_error: deny); nothing was sent. "
        f"Retry in {seconds:.0f} s."
    )


def spend_alert_subject(budget: str, group: str, threshold: int) -> str:
    """The subject line of a spend alert mail."""
    return f"loopwarden: budget {budget} at {threshold}% ({group})"


def spend_alert(
    *, budget: str, group: str, threshold: int, spent: str, limit: str, ends: str
) -> str:
    """A group reached 50, 80 or 100 percent of its limit: the figures and how to raise it."""
    return (
        f"loopwarden: budget {budget} for {group} has reached {threshold}% of its limit: "
        f"spent {spent} of {limit}; the period ends {ends}. Raise it for this period: "
        f'POST /admin/spend/limit {{"budget": "{budget}", "limit_usd": ...}} on the '
        "proxy's admin API, or raise it in proxy.budgets."
    )


def spend_reset(budget: str, group: str, found: bool) -> str:
    """The answer to resetting one group's spend."""
    if found:
        return f"reset the spend of budget {budget} for {group} this period"
    return f"budget {budget} has no spend for {group} this period: nothing to reset"


def spend_limit(budget: str, limit: str, ends: str) -> str:
    """The answer to setting a budget's limit for this period."""
    return f"budget {budget}: limit {limit} until the period ends at {ends}"


def anomaly_alert_subject(agent: str) -> str:
    """The subject line of a spend anomaly alert mail."""
    return f"loopwarden: spend anomaly for agent {agent}"


def anomaly_alert(
    *,
    agent: str,
    spent: str,
    window: str,
    median: str | None,
    factor: float,
    min_usd: str,
    sessions: str,
    paused: str | None,
) -> str:
    """An agent's window spent far above its median: the figures, its top sessions, the pause.

    `median` None: the agent has less than a day of history, judged by `min_usd` alone.
    """
    if median is None:
        compared = f"above min_usd {min_usd} (less than a day of history: no median yet)"
    else:
        compared = (
            f"above {factor:g} x its median of {median} per window over 7 days "
            f"and min_usd {min_usd}"
        )
    text = (
        f"loopwarden: spend anomaly for agent {agent}: spent {spent} in {window}, {compared}. "
        f"Top sessions: {sessions}."
    )
    if paused is None:
        return text
    return (
        f"{text} Its calls are paused until reopened: POST /admin/circuits/reopen "
        f'{{"circuit": "{paused}"}} or `loopwarden circuits reopen {paused} --config FILE`.'
    )
