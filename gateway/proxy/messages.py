"""Every user-facing string the proxy sends: error messages to clients and alert texts.

Error messages name the agent and session (never a key); alerts say what paused, why,
for how long, and how to reopen it early.
"""

from __future__ import annotations

from gateway.messages import format_duration

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
