"""Several processes, each with many coroutines, deciding events of one bot pair at once.

`python -m tests.gateway.state.hammer BACKEND TARGET BUDGET COROUTINES` opens a store
(sqlite: TARGET is the file; redis: the URL), prints `ready`, waits for a line on stdin,
then decides COROUTINES events of one pair concurrently and prints how many were
admitted. `admitted_across_processes` starts the processes, releases them together and
sums their counts: with a shared store, the sum is the budget exactly.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from gateway.state.base import StateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from guards.bot_loop import BotLoopPolicy

ROOT = Path(__file__).resolve().parents[3]
WAIT_SECONDS = 60.0
"""A bound on each process, so a broken run fails instead of hanging; never a pass condition."""


def _open(backend: str, target: str) -> StateStore:
    if backend == "sqlite":
        return SqliteStateStore(target)
    return RedisStateStore(target, key_prefix="hammer:")


async def _hammer(backend: str, target: str, budget: int, coroutines: int) -> int:
    store = _open(backend, target)
    await store.start()
    try:
        # An hour-long window: every event of the run counts, however slow the machine.
        policy = BotLoopPolicy(
            max_events_per_window=budget, window_seconds=3600.0, cooldown_seconds=3600.0
        )
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        decisions = await asyncio.gather(
            *(
                store.pair_decide(
                    scope="discord:hammer", self_bot_id="a", sender_bot_id="b", policy=policy
                )
                for _ in range(coroutines)
            )
        )
    finally:
        await store.aclose()
    return sum(1 for decision in decisions if decision.allowed)


def admitted_across_processes(
    backend: str, target: str, *, budget: int, processes: int = 2, coroutines: int = 20
) -> list[int]:
    """How many events each process got admitted, all released at the same moment."""
    command = [sys.executable, "-m", "tests.gateway.state.hammer", backend, target]
    children = [
        subprocess.Popen(
            [*command, str(budget), str(coroutines)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "ready", child.communicate(timeout=WAIT_SECONDS)
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        counts = []
        for child in children:
            out, err = child.communicate(timeout=WAIT_SECONDS)
            assert child.returncode == 0, err
            counts.append(int(out.strip()))
        return counts
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            with child:  # waits and closes its pipes, also when an assertion failed
                pass


if __name__ == "__main__":
    backend_, target_, budget_, coroutines_ = sys.argv[1:5]
    print(asyncio.run(_hammer(backend_, target_, int(budget_), int(coroutines_))))
