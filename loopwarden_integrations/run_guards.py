"""One LoopGuard turn per agent run, for the tool wrappers of the agent frameworks.

`guard_tools` in `loopwarden_integrations.langchain` and `.openai_agents` takes a `LoopGuard`
or a zero-argument factory of one. Each framework names its runs by an object
that lives exactly as long as the run (LangChain: a marker riding on the root run's
callbacks; the OpenAI Agents SDK: the run's `Usage`), and `RunGuards.of(run)` hands back
that run's guard:
- a factory is called once per run, so overlapping runs keep separate counts;
- a single guard gets `reset_turn()` whenever a run other than the last one it saw calls a
  tool, so runs that overlap reset each other: give a factory to agents run concurrently.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from guards.loop_guard import LoopGuard

GuardSource = LoopGuard | Callable[[], LoopGuard]
"""A guard shared by every run (reset per run), or a factory making one per run."""


class RunGuards:
    """The LoopGuard of each agent run, from a shared guard or a factory."""

    def __init__(self, guard: GuardSource) -> None:
        if not isinstance(guard, LoopGuard) and not callable(guard):
            raise TypeError(
                "guard must be a LoopGuard or a zero-argument function returning one, "
                f"got {type(guard).__name__}"
            )
        self._source = guard
        # Re-entrant: a collected run's weakref callback may fire inside `of` (during GC).
        self._lock = threading.RLock()
        # By id of the run object: the frameworks' run objects are not all hashable.
        self._runs: dict[int, tuple[weakref.ref[object], LoopGuard]] = {}
        self._last: weakref.ref[object] | None = None

    def of(self, run: object) -> LoopGuard:
        """The guard of the run `run` stands for (a new turn on the run's first call)."""
        source = self._source
        if isinstance(source, LoopGuard):
            with self._lock:
                if self._last is None or self._last() is not run:
                    source.reset_turn()
                    self._last = weakref.ref(run)
            return source
        key = id(run)
        with self._lock:
            entry = self._runs.get(key)
            if entry is not None and entry[0]() is run:
                return entry[1]
            guard = source()
            if not isinstance(guard, LoopGuard):
                raise TypeError(
                    f"the guard factory must return a LoopGuard, got {type(guard).__name__}"
                )
            self._runs[key] = (weakref.ref(run, lambda _: self._forget(key)), guard)
            return guard

    def _forget(self, key: int) -> None:
        """Drop a finished run's guard (its run object was collected)."""
        with self._lock:
            entry = self._runs.get(key)
            if entry is not None and entry[0]() is None:
                del self._runs[key]
