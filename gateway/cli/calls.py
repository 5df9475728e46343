"""`loopwarden circuits list|reopen` and `loopwarden calls export|preview-rule`.

They open the CallStore of the configured state backend directly, so they work while a
proxy or gateway runs and share its circuits and request log: sqlite (the same file)
or redis (the same server and key prefix). With memory state the circuits and log live
inside the running process, so these commands say so and point at the admin API.

Decisions where DESIGN.md is silent:
- `circuits reopen` exits 0 when it lifted a pause and 1 when the circuit was not paused
  (its repeat counts are cleared either way).
- `calls preview-rule` replays the logged calls of the window (7 days by default) through
  the rule alone, as the console's Rules page does (`gateway.calls.preview`); `--rule` is
  a rule's name in `proxy.rules` or a rule written inline as YAML or JSON.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TextIO, TypeVar

import yaml

from gateway.app.errors import ConfigError, LoopwardenError, StateError
from gateway.app.messages import format_duration
from gateway.calls.export import write_csv
from gateway.calls.factory import build_call_store
from gateway.calls.preview import PREVIEW_SECONDS
from gateway.calls.preview import preview as rule_preview
from gateway.calls.store import CallStore
from gateway.config.safeyaml import YamlLimitError, load_yaml
from gateway.config.schema import Config
from guards.call_loop import CallLoopPolicy, UniquenessRule

NEEDS_SHARED_STATE = (
    "error: with state.backend: memory the circuits and the request log live inside the "
    "running proxy or gateway. Use its admin API (GET /admin/circuits, POST "
    "/admin/circuits/reopen) or /loop circuits in chat, or set state.backend to sqlite "
    "or redis to use this command."
)
DEFAULT_SINCE = PREVIEW_SECONDS
T = TypeVar("T")


class NoSharedState(LoopwardenError):
    """The command needs a state backend other processes can open (sqlite or redis)."""


def run_command(command: Coroutine[object, object, int]) -> int:
    """Run one command to its exit code; no shared state is 2, unreachable state 1."""
    try:
        return asyncio.run(command)
    except NoSharedState:
        print(NEEDS_SHARED_STATE, file=sys.stderr)
        return 2
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _using(config: Config, work: Callable[[CallStore], Awaitable[T]]) -> T:
    """Run `work` on the config's shared CallStore, opened for it and closed after."""
    if config.state.backend == "memory":
        raise NoSharedState
    proxy = config.proxy
    policy = proxy.call_loop.policy() if proxy is not None else CallLoopPolicy()
    store = build_call_store(config.state, policy, proxy.rules if proxy is not None else ())
    await store.start()
    try:
        return await work(store)
    finally:
        await store.aclose()


async def list_circuits(config: Config, out: TextIO) -> int:
    """Print the paused circuits and rule groups, one per line."""
    paused = await _using(config, lambda store: store.paused())
    if not paused:
        print("no circuit is paused", file=out)
        return 0
    width = max(len(p.circuit) for p in paused)
    print(f"{'CIRCUIT':<{width}}  {'LEFT':>12}  {'REFUSED':>7}  REASON", file=out)
    for p in paused:
        left = format_duration(p.remaining)
        print(f"{p.circuit:<{width}}  {left:>12}  {p.count:>7}  {p.reason}", file=out)
    return 0


async def reopen_circuit(config: Config, circuit: str, out: TextIO) -> int:
    """Lift one circuit's (or rule group's) pause."""
    if await _using(config, lambda store: store.reopen(circuit)):
        print(f"reopened {circuit}", file=out)
        return 0
    print(f"{circuit} was not paused (its repeat counts start afresh)", file=out)
    return 1


async def export_calls(config: Config, since: float, out: TextIO) -> int:
    """Write the request log of the last `since` seconds as CSV."""
    write_csv(await _using(config, lambda store: store.calls_since(since)), out)
    return 0


def resolve_rule(config: Config, text: str) -> UniquenessRule:
    """A rule by its name in `proxy.rules`, or written inline as YAML/JSON (ConfigError)."""
    rules = config.proxy.rules if config.proxy is not None else ()
    for rule in rules:
        if rule.name == text:
            return rule
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, YamlLimitError):
        data = None
    if not isinstance(data, Mapping):
        known = ", ".join(rule.name for rule in rules) or "none configured"
        raise ConfigError(
            "--rule", f"no rule named {text[:60]!r} (rules: {known}), nor a rule mapping"
        )
    try:
        return UniquenessRule.from_dict({str(key): value for key, value in data.items()})
    except ValueError as exc:
        raise ConfigError("--rule", str(exc)) from None


async def preview(config: Config, rule: UniquenessRule, since: float, out: TextIO) -> int:
    """Print how many logged calls of the last `since` seconds the rule would have stopped."""
    entries = await _using(config, lambda store: store.calls_since(since))
    pause = config.proxy.call_loop.pause_seconds if config.proxy is not None else 300.0
    stopped = rule_preview(rule, entries, pause_seconds=pause).would_refuse
    print(
        f"rule {rule.name} would have stopped {stopped} of {len(entries)} logged calls "
        f"in the last {format_duration(since)}",
        file=out,
    )
    return 0
