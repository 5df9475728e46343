"""Building a guarded call: the circuit, the rule fields and the fingerprint of one request.

Rule fields come from the `X-Loopwarden-Session`, `-Step`, `-Agent`, `-Customer`,
`-User` and `-Feature` headers (those headers are not forwarded upstream), the model from
the body, except what the proxy key binds: the agent always, and the customer, user and
feature its config sets are the key's (issue 20: budgets `per` those fields are the key's
to spend, so a header naming another agent neither escapes a refusal nor spends another
agent's budget). A header that names a bound field's own value is accepted; one that
names another value is refused with `CallFieldError` naming the header. The circuit is
the client's root + session (+ step). The SDK's retry number (`x-stainless-retry-count`,
sent by the OpenAI and Anthropic SDKs) goes to the request log: plain digits up to
`MAX_RETRY`; any other value (a sign, a look-alike digit, a 5,000-digit number) is logged
as 0. A field that is not valid Unicode text (a header's non-UTF-8 bytes, a lone
surrogate escaped in the body's model name) is refused with `CallFieldError`, naming it:
no store could keep it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.app.errors import LoopwardenError
from gateway.calls.budgets import SpendVerdict
from gateway.proxy.auth import ProxyClient
from gateway.proxy.provider import GuardedCall, Provider
from guards.call_loop import CallDecision, circuit_key, fingerprint_call

SESSION_HEADER = "X-Loopwarden-Session"
FIELD_HEADERS: tuple[tuple[str, str], ...] = (
    ("step", "X-Loopwarden-Step"),
    ("agent", "X-Loopwarden-Agent"),
    ("customer", "X-Loopwarden-Customer"),
    ("user", "X-Loopwarden-User"),
    ("feature", "X-Loopwarden-Feature"),
)
RETRY_HEADER = "x-stainless-retry-count"
# SDKs retry a handful of times; the bound keeps the value a small integer column.
MAX_RETRY = 1_000


class CallFieldError(LoopwardenError, ValueError):
    """A call field that is not valid Unicode text; the message names the field."""


@dataclass(slots=True)
class ProxiedCall:
    """One guarded call on its way through the proxy; `decision` and `spend` once decided."""

    provider: Provider
    client: ProxyClient
    call: GuardedCall
    session: str
    circuit: str
    fingerprint: str
    fields: dict[str, str]
    request_bytes: int
    retry: int
    started: float
    decision: CallDecision | None = None
    spend: SpendVerdict | None = None

    # What the request log reads of a call (`gateway.proxy.request_log.LoggedRequest`).
    @property
    def provider_name(self) -> str:
        """The route's provider."""
        return self.provider.name

    @property
    def agent(self) -> str:
        """The key's agent."""
        return self.client.agent

    @property
    def model(self) -> str:
        """The model the body names."""
        return self.call.model

    @property
    def max_output(self) -> int | None:
        """The body's output limit (`max_tokens` or the provider's name for it)."""
        return self.call.max_output


def rule_fields(headers: Mapping[str, str], client: ProxyClient, model: str) -> dict[str, str]:
    """The fields rules and budgets read: the key's bound ones, the headers', the model.

    Raises CallFieldError for a field that is not valid Unicode text, or a header that
    names another value than the key binds its field to.
    """
    fields = {"agent": client.agent, **dict(client.bound)}
    for name, header in FIELD_HEADERS:
        value = headers.get(header)
        if not value:
            continue
        bound = fields.get(name)
        if bound is None:
            fields[name] = _text(header, value)
        elif value != bound:
            raise CallFieldError(
                f"{header}: this proxy key sets {name} to {bound!r}; a header cannot change it"
            )
    session = headers.get(SESSION_HEADER, "")
    if session:
        fields["session"] = _text(SESSION_HEADER, session)
    fields["model"] = _text("the model name", model)
    return fields


def _text(name: str, value: str) -> str:
    """`value`, when it is valid Unicode text (aiohttp keeps a header's bad bytes as surrogates)."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise CallFieldError(f"{name} is not valid UTF-8 text (character {exc.start})") from None
    return value


def retry_number(value: str | None) -> int:
    """The SDK's retry number from its header: 0 unless plain ASCII digits up to MAX_RETRY."""
    # isdigit alone takes "²" and "٣"; int() takes "+1", " 1" and "1_0".
    if value is None or not (0 < len(value) <= len(str(MAX_RETRY))):
        return 0
    if not (value.isascii() and value.isdigit()):
        return 0
    number = int(value)
    return number if number <= MAX_RETRY else 0


def build_call(
    provider: Provider,
    client: ProxyClient,
    headers: Mapping[str, str],
    described: GuardedCall,
    *,
    size: int,
    started: float,
) -> ProxiedCall:
    """The guarded call a request makes: its circuit, fields and fingerprint.

    Raises CallFieldError for a rule field that is not valid Unicode text.
    """
    fields = rule_fields(headers, client, described.model)
    session = fields.get("session", "")
    return ProxiedCall(
        provider=provider,
        client=client,
        call=described,
        session=session,
        circuit=circuit_key(client.root, session or None, fields.get("step")),
        fingerprint=fingerprint_call(described.model, described.messages),
        fields=fields,
        request_bytes=size,
        retry=retry_number(headers.get(RETRY_HEADER)),
        started=started,
    )
