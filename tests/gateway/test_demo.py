"""`loopwarden demo`: the URL, the transcript and the guard's decisions in the terminal, exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from pydantic import SecretStr

from connectors.room.hub import RoomHub
from gateway.app import messages
from gateway.app.runtime import Gateway
from gateway.demo.model import DemoModel
from gateway.demo.room import (
    DECISION_LOGGER,
    KICKOFF,
    RERUN_BUSY,
    RERUN_NOTICE,
    DemoOptions,
    Scenarios,
    demo_config,
    parse_args,
    run_demo,
)
from tests.connectors.room.room_helpers import Event, from_sender, join, next_event, say
from tests.gateway.demo_process import CUT, DEMO_ARGS, run_demo_until_cut

WAIT_SECONDS = 30.0
"""A bound on each wait so a broken demo fails instead of hanging; never a pass condition."""

FINDER_STOP = messages.TOOL_LOOP_STOP.format(tool="find_document")
ORACLE_STOP = messages.CALL_LOOP_STOP.format(pause="5 min")
ORACLE_ASKS = "@oracle did the auditors answer?"
CIRCUIT = "oracle/session=room%3Alobby"
TOKEN = "adm-demo-issue12-7f3e"
FIFTH_REPEAT = "[model] demo-oracle: the same request again (5 in a row)"


class Terminal(io.StringIO):
    """Captures the demo's output and flags the moment every given text has been printed."""

    def __init__(self, *markers: str) -> None:
        super().__init__()
        self.missing = set(markers)
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        self.missing = {marker for marker in self.missing if marker not in text}
        if not self.missing:
            self.seen.set()
        return super().write(text)


async def _run_until_seen(terminal: Terminal, kickoff_gap: float = 4.0) -> int:
    """Run the demo (no reply delay) until the terminal has seen its markers, then stop it."""
    stop = asyncio.Event()
    options = DemoOptions(port=0, open_browser=False, delay=0, kickoff_gap=kickoff_gap)
    demo = asyncio.create_task(run_demo(options, out=terminal, stop=stop))
    async with asyncio.timeout(WAIT_SECONDS):
        await terminal.seen.wait()
        stop.set()
        return await demo


async def test_demo_prints_url_transcript_and_the_guards_decisions() -> None:
    terminal = Terminal(CUT)
    assert await _run_until_seen(terminal) == 0
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
    command = [sys.executable, "-m", "gateway", *DEMO_ARGS]
    run = await run_demo_until_cut(command, wait_seconds=WAIT_SECONDS)
    assert run.returncode == 0, run.errors
    assert run.lines[0].startswith("loopwarden demo: open http://127.0.0.1:")
    assert "[guard] room:lobby bot_loop refused budget_exceeded" in "".join(run.lines)
    assert run.rest.endswith("demo stopped\n")
    assert "Traceback" not in run.errors


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
    assert [bot.id for bot in config.bots] == ["ping", "pong", "echo", "finder", "quiet", "oracle"]
    assert {bot.platform for bot in config.bots} == {"room"}
    assert (config.policy.respond_to.humans, config.policy.respond_to.bots) == (
        "mentions",
        "mentions",
    )
    assert config.admins.room == ("alice",)
    loop = config.policy.bot_loop
    assert (loop.max_events_per_window, loop.window_seconds, loop.cooldown_seconds) == (6, 30, 20)
    assert config.http.port == 0
    assert demo_config().agents["ping"].model_dump()["delay"] == 0.5


async def test_issue12_the_kickoff_shows_every_guard_at_work_in_the_terminal() -> None:
    silent_to_echo = "silence silent (the agent chose silence) bot=quiet sender=echo"
    terminal = Terminal(CUT, FINDER_STOP, silent_to_echo, ORACLE_STOP)
    assert await _run_until_seen(terminal, kickoff_gap=0) == 0
    out = terminal.getvalue()
    said = [line for line in out.splitlines() if line.startswith("[lobby] demo: ")]
    assert said == [f"[lobby] demo: {step.text}" for step in KICKOFF]
    # ping and pong: the pair budget still opens a cooldown.
    assert f"[guard] room:lobby bot_loop {CUT}, notice posted pair=pong↔ping\n" in out
    # finder: the loop guard warns (in the tool results its model gets), blocks, halts.
    warned = "[model] demo-finder: the tool result carries the loop guard's warn (no_progress_warn)"
    assert out.count(warned) == 4
    assert (
        "[model] demo-finder: the loop guard did not run the tool: find_document was called "
        "8 times this turn (threshold 8) and returned the same result 7 times in a row\n"
    ) in out
    assert "[guard] room:lobby tool_loop halted the agent's turn (no_progress_halt)\n" in out
    assert f"[lobby] finder (bot): {FINDER_STOP}\n" in out
    # quiet: NO_REPLY is silence for echo, the notice for the person who addressed it.
    notice = "silence notice (silence for an addressed human) bot=quiet sender=demo"
    assert f"[guard] room:lobby {notice}\n" in out
    assert f"[guard] room:lobby {silent_to_echo}\n" in out
    assert [line for line in out.splitlines() if line.startswith("[lobby] quiet (bot)")] == [
        f"[lobby] quiet (bot): {messages.SILENCE_NOTICE}"
    ]
    # oracle: 5 identical requests reach the model, the 6th is refused and the circuit paused.
    assert f"{FIFTH_REPEAT}\n" in out
    assert "(6 in a row)" not in out
    assert "[guard] room:lobby call_loop halted the agent's turn (loop_detected)\n" in out
    assert f"[lobby] oracle (bot): {ORACLE_STOP}\n" in out
    assert "NO_REPLY" not in out.replace("answers NO_REPLY", "")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class DemoRoom:
    """The demo's gateway and built-in model, an admin token, and what the model reported."""

    gateway: Gateway
    http: aiohttp.ClientSession
    clock: Clock
    model_lines: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.gateway.port}{path}"

    async def circuits(self) -> list[object]:
        """The paused circuits `GET /admin/circuits` lists."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.http.get(self.url("/admin/circuits"), headers=headers) as response:
            assert response.status == 200
            body = await response.json()
        return [entry["circuit"] for entry in body["circuits"]]

    async def calls(self, **filters: str) -> tuple[list[dict[str, object]], dict[str, object]]:
        """The calls and totals `GET /admin/calls` answers for these filters."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = self.url("/admin/calls")
        async with self.http.get(url, params=filters, headers=headers) as response:
            assert response.status == 200
            body = await response.json()
        return body["calls"], body["totals"]

    def said_by(self, sender: str) -> list[str]:
        """The lobby messages `sender` posted."""
        hub = RoomHub.for_app(self.gateway.app)
        return [message.text for message in hub.history("lobby") if message.sender_id == sender]


@contextlib.asynccontextmanager
async def demo_room() -> AsyncIterator[DemoRoom]:
    """The demo's config and model in a started gateway with a known admin token."""
    lines: list[str] = []
    async with DemoModel(report=lines.append) as model, aiohttp.ClientSession() as http:
        config = demo_config(port=0, delay=0, model_url=model.url)
        admin = config.http.model_copy(update={"admin_token": SecretStr(TOKEN)})
        clock = Clock()
        gateway = Gateway(config.model_copy(update={"http": admin}), clock=clock)
        await gateway.start()
        try:
            yield DemoRoom(gateway, http, clock, lines)
        finally:
            await gateway.stop(5.0)


def _system(event: Event) -> bool:
    """The gateway's own answer (to a `/loop` command), posted as `loopwarden`."""
    return event.get("system") is True


async def test_issue12_oracles_circuit_pauses_at_the_6th_call_and_reopen_lifts_it() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as alice:
        await join(alice, "alice")
        await say(alice, ORACLE_ASKS)
        assert (await next_event(alice, "message", from_sender("oracle")))["text"] == ORACLE_STOP
        assert room.model_lines[-1] == FIFTH_REPEAT
        assert await room.circuits() == [CIRCUIT]
        await say(alice, "/loop circuits")
        listing = str((await next_event(alice, "message", _system))["text"])
        assert listing.startswith("Paused LLM-call circuits:")
        assert f"{CIRCUIT}: 5 min left, loop_detected" in listing
        # While paused, nothing reaches the model: a person gets a short notice.
        served = len(room.model_lines)
        await say(alice, "@oracle any news?")
        paused = str((await next_event(alice, "message", from_sender("oracle")))["text"])
        assert paused == messages.CALL_PAUSED.format(pause="5 min")
        assert len(room.model_lines) == served
        room.clock.now += 1
        await say(alice, f"/loop reopen {CIRCUIT}")
        ack = str((await next_event(alice, "message", _system))["text"])
        assert CIRCUIT in ack
        assert await room.circuits() == []
        # Reopened: oracle's requests reach the model again, five of them, until it loops again.
        await say(alice, ORACLE_ASKS)
        assert (await next_event(alice, "message", from_sender("oracle")))["text"] == ORACLE_STOP
        assert room.model_lines[served:] == [
            f"[model] demo-oracle: the same request again ({n} in a row)" for n in range(2, 6)
        ]


async def test_issue12_quiet_posts_nothing_for_a_bot_and_the_notice_for_a_person() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as alice:
        await join(alice, "alice")
        await say(alice, "@echo tell @quiet hello")
        echoed = await next_event(alice, "message", from_sender("echo"))
        assert echoed["text"] == "alice said: @echo tell @quiet hello"  # a bot addressing quiet
        notice = await next_event(alice, "message", from_sender("quiet"))
        assert notice["text"] == messages.SILENCE_NOTICE
    assert room.said_by("quiet") == [messages.SILENCE_NOTICE]


async def test_issue12_finder_is_halted_by_the_loop_guard_with_the_short_notice() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as alice:
        await join(alice, "alice")
        await say(alice, "@finder find the invoice")
        assert (await next_event(alice, "message", from_sender("finder")))["text"] == FINDER_STOP
        assert await room.circuits() == []  # the loop guard stopped finder, not the call guard
    assert room.said_by("finder") == [FINDER_STOP]
    assert [line.split(": ", 1)[1].split(" (")[0] for line in room.model_lines] == [
        "the same request again",
        "the same request again",
        *["the tool result carries the loop guard's warn"] * 4,
        "the loop guard did not run the tool: find_document was called 8 times this turn",
    ]


async def test_issue12_the_admin_api_lists_oracles_and_finders_model_calls() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as alice:
        await join(alice, "alice")
        await say(alice, "@finder find the invoice")
        assert (await next_event(alice, "message", from_sender("finder")))["text"] == FINDER_STOP
        await say(alice, ORACLE_ASKS)
        assert (await next_event(alice, "message", from_sender("oracle")))["text"] == ORACLE_STOP
        await room.gateway.request_log.settle()
        oracle, totals = await room.calls(agent="oracle")
        finder, _ = await room.calls(agent="finder")
    # Newest first: the refused 6th repeat, then the 5 repeats and the first request answered.
    assert [call["outcome"] for call in oracle] == ["loop_detected"] + ["forwarded"] * 6
    refused = oracle[0]
    assert (refused["circuit"], refused["estimated"], refused["refused"]) == (CIRCUIT, True, True)
    # The demo's model has a demo price (demo.yaml's proxy.prices): issue 22's test reads it.
    assert refused["priced"] is True
    assert totals["refused"] == 1
    assert totals["unpriced"] == 0
    # finder: its first request and one per tool result until the loop guard halted it.
    assert [call["outcome"] for call in finder] == ["forwarded"] * 9
    assert {call["model"] for call in finder} == {"demo-finder"}


def _notice(text: str) -> Callable[[Event], bool]:
    return lambda event: event.get("text") == text


async def _pair_cut(ws: aiohttp.ClientWebSocketResponse) -> Event:
    """Wait for the ping-pong's cooldown notice (the bot-loop guard's cut)."""
    return await next_event(
        ws, "message", lambda e: str(e.get("text")).startswith("Loop guard: pausing replies")
    )


async def test_issue22_the_demo_models_calls_show_tokens_a_demo_cost_and_the_cost_saved() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as alice:
        await join(alice, "alice")
        await say(alice, ORACLE_ASKS)
        assert (await next_event(alice, "message", from_sender("oracle")))["text"] == ORACLE_STOP
        await room.gateway.request_log.settle()
        oracle, totals = await room.calls(agent="oracle")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = room.url("/admin/calls/series")
        async with room.http.get(url, params={"span": "day"}, headers=headers) as response:
            series = await response.json()
    answered = oracle[-1]
    assert isinstance(answered["input_tokens"], int)
    assert isinstance(answered["output_tokens"], int)
    assert answered["input_tokens"] > 0
    assert answered["output_tokens"] > 0
    assert isinstance(totals["input_tokens"], int)
    assert isinstance(totals["cost"], float)
    assert isinstance(totals["cost_saved"], float)
    assert totals["input_tokens"] > 0
    assert totals["cost"] > 0
    assert totals["cost_saved"] > 0  # the refused 6th request, at the demo price
    costs = [bucket["cost"] for bucket in series["buckets"]]
    assert max(costs) > 0  # the cost chart is not flat


async def test_issue22_the_demo_model_reports_usage_from_the_request_and_answer_sizes() -> None:
    body = {"model": "demo-oracle", "messages": [{"role": "user", "content": "alice: hi"}]}
    async with (
        DemoModel() as model,
        aiohttp.ClientSession() as http,
        http.post(f"{model.url}/chat/completions", json=body) as response,
    ):
        answer = await response.json()
    usage = answer["usage"]
    sent = len(json.dumps(body).encode())
    assert usage["prompt_tokens"] == -(-sent // 4)
    reply = len(json.dumps(answer["choices"][0]["message"]))
    assert usage["completion_tokens"] == -(-reply // 4)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_issue22_scenario_notices_stay_in_the_history_a_late_joiner_reads() -> None:
    async with demo_room() as room:
        hub = RoomHub.for_app(room.gateway.app)
        scenarios = Scenarios(hub, room.gateway, KICKOFF[:1], gap=0)
        async with room.http.ws_connect(room.url("/room/ws")) as early:
            await join(early, "early")
            scenarios.start("lobby")
            await _pair_cut(early)
        await scenarios.aclose()
        async with room.http.ws_connect(room.url("/room/ws")) as late:
            history = await join(late, "late")
        async with room.http.get(room.url("/room/history")) as response:
            kept = (await response.json())["messages"]
    entries = history["messages"]
    assert isinstance(entries, list)
    assert {k: v for k, v in entries[0].items() if k != "ts"} == {
        "type": "notice",
        "room": "lobby",
        "text": KICKOFF[0].watch,
    }
    assert entries[1]["text"] == KICKOFF[0].text
    assert kept[0]["text"] == KICKOFF[0].watch
    # Joins and leaves stay out of the history.
    assert not [e for e in entries if e["type"] == "notice" and "joined" in str(e["text"])]


async def test_issue22_slash_demo_by_anyone_reruns_the_scenarios_after_a_fresh_start() -> None:
    steps = (KICKOFF[0], KICKOFF[3])
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as bob:
        hub = RoomHub.for_app(room.gateway.app)
        scenarios = Scenarios(hub, room.gateway, steps, gap=0)
        stop_listening = hub.subscribe(scenarios.on_event)
        await join(bob, "bob")  # not an admin
        scenarios.start("lobby")
        await _pair_cut(bob)
        assert (await next_event(bob, "message", from_sender("oracle")))["text"] == ORACLE_STOP
        assert await room.circuits() == [CIRCUIT]
        # A second later the pair's 20 s cooldown and oracle's 5 min pause still run:
        # without the fresh start nothing would happen again.
        room.clock.now += 1
        await say(bob, "/demo")
        await next_event(bob, "notice", _notice(RERUN_NOTICE.format(name="bob")))
        again = await _pair_cut(bob)
        answer = await next_event(bob, "message", from_sender("oracle"))
        await scenarios.aclose()
        stop_listening()
    assert answer["text"] == ORACLE_STOP  # oracle reached its model again, and looped again
    assert str(again["text"]).startswith("Loop guard: pausing replies")
    assert room.said_by("demo") == [KICKOFF[0].text, KICKOFF[3].text] * 2
    assert room.said_by("ping").count("@pong ping") == 8  # four in each round


async def test_issue22_a_slash_demo_while_the_scenarios_run_is_told_to_wait() -> None:
    async with demo_room() as room, room.http.ws_connect(room.url("/room/ws")) as bob:
        hub = RoomHub.for_app(room.gateway.app)
        # A gap no test waits out: the run is still on when bob asks again.
        scenarios = Scenarios(hub, room.gateway, KICKOFF[:2], gap=3600)
        stop_listening = hub.subscribe(scenarios.on_event)
        await join(bob, "bob")
        scenarios.start("lobby")
        await say(bob, "/demo")
        await next_event(bob, "notice", _notice(RERUN_BUSY))
        assert scenarios.running
        await scenarios.aclose()
        stop_listening()
    assert room.said_by("demo") == [KICKOFF[0].text]
