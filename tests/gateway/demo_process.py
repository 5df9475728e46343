"""Run `loopwarden demo` as a process until the guard cuts the ping-pong, then SIGINT it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CUT = "cooldown opened for 20 s"
"""The terminal line that says the bot-loop guard cut ping and pong."""
DEMO_ARGS = ("demo", "--port", "0", "--no-browser", "--delay", "0")


@dataclass(frozen=True)
class DemoRun:
    """What the demo printed up to the cut (`lines`), after it (`rest`), and on stderr."""

    returncode: int | None
    lines: list[str]
    rest: str
    errors: str


async def run_demo_until_cut(
    command: Sequence[str],
    *,
    wait_seconds: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> DemoRun:
    """Start `command` (a demo), read its terminal until `CUT`, then SIGINT and collect."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(wait_seconds):
            while CUT not in (line := (await process.stdout.readline()).decode()):
                assert line, f"the demo ended early: {lines}"
                lines.append(line)
            process.send_signal(signal.SIGINT)
            rest, errors = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return DemoRun(process.returncode, lines, rest.decode(), errors.decode())
