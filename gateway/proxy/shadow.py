"""Shadow mode in the proxy: a call a guard in shadow mode refuses is forwarded, and says so.

`proxy.call_loop.mode` covers the circuit's verdicts (`loop_detected`, `loop_paused` of a
circuit) and each rule's `mode` its own (`duplicate_call`, `loop_paused` of the rule's
group). The CallStore decides exactly as in enforce mode, so its state is what enforce
mode would leave: the refused call is counted nowhere, and a pause opens (it is listed
by `GET /admin/circuits` and can be reopened). The call is then forwarded like an
admitted one, and its response, whatever the upstream answers, carries
`x-loopwarden-shadow: <code>` (`loop_detected`, `loop_paused`, or
`duplicate_call:<rule name>`) so a client can log it. No refusal answer and no alert is
sent; the verdict is logged at INFO with `shadow: "true"` among the structured fields.
The budgets count the call as any forwarded one: the store's admission keeps its
estimate held (`ShadowGuards`), so a guard in shadow never lets calls pass a budget
(issue 20: before, such a call held nothing and concurrent repeats all went through).
The waiver is the guarded call's (`gateway.proxy.guarded`), as for the gateway's agents.
An agent the anomaly detector paused (`proxy.anomaly.action: pause`) is refused
`loop_paused` whatever `call_loop.mode` says: that pause is a spend decision (issue 20).

Decisions where DESIGN.md is silent: the first refusing check settles a call, as in
enforce mode (the circuit's pause, the rule groups' pauses, the circuit's repeats, then
the rules in order). So when a shadow verdict comes first, the checks after it do not
see the call: while a circuit in shadow mode is paused, an enforce-mode rule does not
count or refuse that circuit's calls. Put a guard in shadow only with the others it
could mask in shadow too, or accept that.
"""

from __future__ import annotations

from aiohttp import web

from gateway.calls.store import ShadowGuards
from gateway.config.proxy import ProxyConfig

SHADOW_HEADER = "x-loopwarden-shadow"
SHADOW_CODE = web.RequestKey("loopwarden_shadow", str)
"""The shadow verdict of a forwarded call, set on its request for `add_shadow_header`."""


def shadow_guards(config: ProxyConfig) -> ShadowGuards:
    """Which of the proxy's call guards run in shadow mode."""
    return ShadowGuards(
        config.call_loop.mode == "shadow",
        frozenset(rule.name for rule in config.rules if rule.mode == "shadow"),
    )


async def add_shadow_header(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: a forwarded call's shadow verdict goes out with its response."""
    code = request.get(SHADOW_CODE)
    if code is not None:
        response.headers[SHADOW_HEADER] = code
