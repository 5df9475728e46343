"""Web room memory: how much a flood of room names grows the gateway's RSS (issue 20).

Run with `.venv/bin/python -m bench.room_memory_bench [--quick]`.

Each workload runs against a gateway process of its own (the demo's six bots, memory
state, no reply delay, a free loopback port), which this process drives through the
room's websocket as a browser would: join a room, post two 16 KB messages (4,000 emoji,
the most the room takes), join the next. The figure is the growth of the gateway's RSS
(`VmRSS` of /proc/<pid>/status) from after a warm-up (8 times the same in the lobby) to after the
workload, each read once the bots have handled every message and the reclaimed rooms
were forgotten, after a `gc.collect()`. Workloads, in the same run:

- baseline: 64 room names, the rooms the hub holds at once (what they may keep anyway);
- attack: 1,500 room names, so 1,436 rooms are reclaimed;
- attack as before issue 20: the same with the reclaim's forget switched off and the
  transcript budget at its largest (64 GiB), as the gateway held it before (skipped
  with `--quick`).

Target: the attack grows RSS by under 16 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
from contextlib import suppress
from functools import partial
from pathlib import Path

import aiohttp

from connectors.room import RoomConnector
from connectors.room.hub import MAX_JOINS, ROOM_HUB
from connectors.room.reclaim import Reclaimed
from gateway.app.runtime import Gateway
from gateway.config import StateConfig
from gateway.config.limits import MAX_TRANSCRIPT_BYTES
from gateway.demo.room import demo_config
from gateway.state.memory import MemoryStateStore

TARGET_MB = 16.0
WARM_ROUNDS = 8
BASELINE_ROOMS = 64
ATTACK_ROOMS = 1_500
BIG = "\U0001f600" * 4_000
MB = 1_000_000
WAIT_SECONDS = 30.0


# The gateway side (a process of its own)


async def serve(before: bool) -> None:
    """Run the demo gateway; on each line of stdin settle and report, until stdin closes."""
    config = demo_config(port=0, delay=0)
    if before:
        Reclaimed.add = lambda self, rooms: None  # type: ignore[method-assign]
        state = StateConfig(max_transcript_bytes=MAX_TRANSCRIPT_BYTES)
        config = config.model_copy(update={"state": state})
    gateway = Gateway(config)
    await gateway.start()
    print(gateway.port, flush=True)
    loop = asyncio.get_running_loop()
    try:
        while await loop.run_in_executor(None, sys.stdin.readline):
            await settle(gateway)
            store = gateway.state
            held = store.transcript_bytes if isinstance(store, MemoryStateStore) else 0
            print(held, flush=True)
    finally:
        await gateway.stop(5.0)


async def settle(gateway: Gateway) -> None:
    """Wait until every room bot handled what it was handed and reclaimed rooms are forgotten."""
    loop = asyncio.get_running_loop()
    waits = []
    for hosted in gateway.hosted.values():
        if isinstance(hosted.connector, RoomConnector):
            done: asyncio.Future[None] = loop.create_future()
            hosted.connector.after_handled(partial(done.set_result, None))
            waits.append(done)
    await asyncio.gather(*waits)
    hub = gateway.app[ROOM_HUB]
    while hub.forgetting:  # noqa: ASYNC110 - the hub's own tasks forget, no event to await
        await asyncio.sleep(0.01)
    gc.collect()


# The driving side


class Served:
    """A gateway process: its port, and its RSS and transcript bytes once settled."""

    def __init__(self, before: bool) -> None:
        command = [sys.executable, "-m", "bench.room_memory_bench", "--serve"]
        if before:
            command.append("--before")
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.port = int(self._readline())

    def settled(self) -> tuple[int, int]:
        """(RSS bytes, transcript bytes) once the bots handled everything sent so far."""
        stdin = self._process.stdin
        assert stdin is not None
        stdin.write("settle\n")
        stdin.flush()
        held = int(self._readline())
        status = Path(f"/proc/{self._process.pid}/status").read_text(encoding="ascii")
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if "VmRSS" in line)
        return rss_kb * 1024, held

    def stop(self) -> None:
        """Close stdin (the gateway stops) and wait for the process."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    def _readline(self) -> str:
        stdout = self._process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError("the gateway process ended before answering")
        return line


async def flood(port: int, names: list[str]) -> None:
    """Join each room in turn and post two 16 KB messages there, each seen echoed."""
    url = f"http://127.0.0.1:{port}/room/ws"
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(names), MAX_JOINS):
            async with session.ws_connect(url, max_msg_size=0) as ws:
                for name in names[start : start + MAX_JOINS]:
                    await ws.send_json({"type": "join", "name": "mallory", "room": name})
                    for tag in ("a", "b"):
                        text = BIG[: -len(name) - 1] + name + tag
                        await ws.send_json({"type": "say", "text": text})
                        await _echoed(ws, text)


async def _echoed(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    """Read frames until the room echoes `text` (within `WAIT_SECONDS`)."""
    async with asyncio.timeout(WAIT_SECONDS):
        async for frame in ws:
            if frame.type is aiohttp.WSMsgType.TEXT and json.loads(frame.data).get("text") == text:
                return
    raise RuntimeError("the room closed the websocket")


def measure(names: list[str], *, before: bool = False) -> tuple[float, float]:
    """RSS growth (MB) of a fresh gateway flooded with `names`, and transcript MB held."""
    served = Served(before)
    try:
        asyncio.run(flood(served.port, ["lobby"] * WARM_ROUNDS))
        start, _ = served.settled()
        asyncio.run(flood(served.port, names))
        end, held = served.settled()
    finally:
        served.stop()
    return (end - start) / MB, held / MB


def main(argv: list[str] | None = None) -> int:
    """Measure the workloads and print each against the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the as-before workload")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        with suppress(KeyboardInterrupt):
            asyncio.run(serve(args.before))
        return 0
    attack = [f"r{n}" for n in range(ATTACK_ROOMS)]
    rows = [
        ("baseline: 64 rooms", measure([f"b{n}" for n in range(BASELINE_ROOMS)])),
        ("attack: 1,500 room names", measure(attack)),
    ]
    if not args.quick:
        rows.append(("attack, as before issue 20", measure(attack, before=True)))
    print(f"{'workload':<30} {'RSS growth':>12} {'transcripts held':>18}")
    for label, (grown, held) in rows:
        print(f"{label:<30} {grown:>9.1f} MB {held:>15.1f} MB")
    grown = rows[1][1][0]
    verdict = "met" if grown < TARGET_MB else "missed"
    print(f"target: the attack grows RSS by under {TARGET_MB:.0f} MB: {verdict} ({grown:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
