"""`loopwarden demo`: the URL, the transcript and the guard's decisions in the terminal, exit 0."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import signal
import sys

import pytest

from gateway.demo import DECISION_LOGGER, DemoOptions, demo_config, parse_args, run_demo

WAIT_SECONDS = 30.0
"""A bound on each wait so a broken demo fails instead of hanging; never a pass condition."""

CUT = "cooldown opened for 20 s"


class Terminal(io.StringIO):
    """Captures the demo's output and flags the moment a given text is printed."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        if self.marker in text:
            self.seen.set()
        return super().write(text)


async def _run_until_cut(terminal: Terminal) -> int:
    stop = asyncio.Event()
    options = DemoOptions(port=0, open_browser=False, delay=0)
    demo = asyncio.create_task(run_demo(options, out=terminal, stop=stop))
    async with asyncio.timeout(WAIT_SECONDS):
        await terminal.seen.wait()
        stop.set()
        return await demo


async def test_demo_prints_url_transcript_and_the_guards_decisions() -> None:
    terminal = Terminal(CUT)
    assert await _run_until_cut(terminal) == 0
    out = terminal.getvalue()
    assert re.search(r"^loopwarden demo: open http://127\.0\.0\.1:\d+/room ", out, re.M)
    assert "[lobby] demo: @ping start\n" in out
    assert "[lobby] ping (bot): @pong ping\n" in out
    assert "[lobby] pong (bot): @ping pong\n" in out
    assert (
        "[guard] room:lobby bot_loop refused budget_exceeded "
        "(event 7 over 6 per 30 s, cooldown 20 s) pair=pong↔ping\n"
    ) in out
    assert f"[guard] room:lobby bot_loop {CUT}, notice posted pair=pong↔ping\n" in out
    # The notice is posted by the turn in flight when the demo stopped: the drain delivers it.
    assert "[lobby] pong (bot): Loop guard: pausing replies between pong and ping" in out
    assert "not_addressed" not in out  # routine admissions stay out of the terminal
    assert out.count("(bot): @pong ping") == 4
    assert out.endswith("demo stopped\n")


async def test_demo_leaves_the_decision_logger_as_it_found_it() -> None:
    logger = logging.getLogger(DECISION_LOGGER)
    before = (list(logger.handlers), logger.level, logger.propagate)
    await run_demo(
        DemoOptions(port=0, open_browser=False, exit_after=0, kickoff=False), out=io.StringIO()
    )
    assert (list(logger.handlers), logger.level, logger.propagate) == before


async def test_exit_after_stops_the_demo_by_itself() -> None:
    terminal = io.StringIO()
    options = DemoOptions(port=0, open_browser=False, exit_after=0, kickoff=False)
    async with asyncio.timeout(WAIT_SECONDS):
        assert await run_demo(options, out=terminal) == 0
    lines = terminal.getvalue().splitlines()
    assert lines[0].startswith("loopwarden demo: open http://")
    assert lines[-1] == "demo stopped"
    assert not any(line.startswith("[lobby]") for line in lines)


async def test_a_port_in_use_is_reported_without_a_traceback() -> None:
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = blocker.sockets[0].getsockname()[1]
    terminal = io.StringIO()
    try:
        options = DemoOptions(port=port, open_browser=False, exit_after=0, kickoff=False)
        assert await run_demo(options, out=terminal) == 1
    finally:
        blocker.close()
        await blocker.wait_closed()
    assert f"port {port}" in terminal.getvalue()
    assert "--port 0" in terminal.getvalue()


async def test_demo_command_runs_until_sigint_and_exits_0() -> None:
    args = ["demo", "--port", "0", "--no-browser", "--delay", "0"]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            while CUT not in (line := (await process.stdout.readline()).decode()):
                assert line, f"the demo ended early: {lines}"
                lines.append(line)
            process.send_signal(signal.SIGINT)
            rest, errors = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, errors.decode()
    assert lines[0].startswith("loopwarden demo: open http://127.0.0.1:")
    assert "[guard] room:lobby bot_loop refused budget_exceeded" in "".join(lines)
    assert rest.decode().endswith("demo stopped\n")
    assert "Traceback" not in errors.decode()


def test_options_default_to_the_documented_values() -> None:
    options = parse_args([])
    assert options == DemoOptions(host="127.0.0.1", port=8787, delay=0.5, exit_after=None)
    assert parse_args(["--no-browser", "--exit-after", "5", "--no-kickoff"]) == DemoOptions(
        open_browser=False, exit_after=5.0, kickoff=False
    )


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--delay", "-1"], ["--exit-after", "x"]])
def test_bad_options_exit_with_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2


def test_demo_config_is_the_documented_room() -> None:
    config = demo_config(port=0, delay=0)
    assert [bot.id for bot in config.bots] == ["ping", "pong", "echo"]
    assert {bot.platform for bot in config.bots} == {"room"}
    assert config.admins.room == ("alice",)
    loop = config.policy.bot_loop
    assert (loop.max_events_per_window, loop.window_seconds, loop.cooldown_seconds) == (6, 30, 20)
    assert config.http.port == 0
    assert demo_config().agents["ping"].model_dump()["delay"] == 0.5
