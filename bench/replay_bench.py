"""Replay throughput: a generated 1M-message Discord export and a 100k-call CSV.

Run with `.venv/bin/python -m bench.replay_bench [--messages N] [--calls N] [--quick]`.

The Discord export is written as DiscordChatExporter writes one (indented JSON, every
field of a message, about 400 bytes each) into a temporary folder: one channel where a
person speaks and then two bots answer each other nine times, a message a second, so
the pair budget and its cooldowns are at work throughout. The CSV is the proxy's
`calls export --csv` of agents resending the same calls. Figures: messages/s and
calls/s of the whole replay (parsing included; CPU time of this process and wall
clock), its peak memory (RSS), and, measured in the same run, the pipeline's own
messages/s (`bench.pipeline_bench`). Targets: at least 20,000 messages/s, under 300 MB.
`--huge-mb N` adds the CPU time of a Telegram export holding one N MB message, whose cost
must grow linearly with N (it grew with its square until issue 20: 48 MB took 9 s).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import resource
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import ijson

from bench.pipeline_bench import BOT_MESSAGES_PER_ROOM, CONFIG, Bench, timed
from gateway.calls.export import CSV_COLUMNS
from gateway.cli.replay import run
from gateway.config import parse_config

TARGET_RATE = 20_000
TARGET_RSS_MB = 300
START = 1_704_067_200  # 2024-01-01T00:00:00Z
REPLAY_CONFIG = """
policy: {bot_loop: {max_events_per_window: 20, window_seconds: 60, cooldown_seconds: 60}}
proxy: {prices: {"gpt-4o*": {input_per_1k: 0.0025, output_per_1k: 0.01}}}
"""
AUTHORS = (
    {"id": "100000000000000001", "name": "alice", "isBot": False},
    {"id": "200000000000000002", "name": "pingbot", "isBot": True},
    {"id": "300000000000000003", "name": "pongbot", "isBot": True},
)


def _author(index: int) -> dict[str, object]:
    who = AUTHORS[0] if index % 10 == 0 else AUTHORS[1 + index % 2]
    return {
        **who,
        "discriminator": "0000",
        "nickname": who["name"],
        "color": None,
        "roles": [],
        "avatarUrl": "https://cdn.discordapp.com/embed/avatars/0.png",
    }


def write_discord(path: Path, count: int) -> None:
    """A DiscordChatExporter file of `count` messages, written as the exporter does."""
    with path.open("w", encoding="utf-8") as out:
        out.write(
            '{\n  "guild": {"id": "1", "name": "bench", "iconUrl": ""},\n'
            '  "channel": {"id": "2", "type": "GuildTextChat", "categoryId": null, '
            '"category": "text", "name": "general", "topic": null},\n  "messages": [\n'
        )
        for index in range(count):
            stamp = datetime.fromtimestamp(START + index, UTC).isoformat(timespec="milliseconds")
            message: dict[str, object] = {
                "id": str(10**18 + index),
                "type": "Default",
                "timestamp": stamp,
                "timestampEdited": None,
                "isPinned": False,
                "content": f"message {index}: shall we go on?",
                "author": _author(index),
                "attachments": [],
                "embeds": [],
                "reactions": [],
                "mentions": [],
            }
            out.write(("    " if index == 0 else ",\n    ") + json.dumps(message))
        out.write(f'\n  ],\n  "messageCount": {count}\n}}\n')


def write_calls(path: Path, count: int) -> None:
    """A calls CSV export of `count` calls: agents that resend one call every second."""
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for index in range(count):
            agent, session = f"agent-{index % 50}", f"run-{index % 500}"
            stamp = datetime.fromtimestamp(START + index // 50, UTC).isoformat(
                timespec="milliseconds"
            )
            cells = {
                "time": stamp,
                "provider": "openai",
                "agent": agent,
                "session": session,
                "circuit": f"{agent}/session={session}",
                "model": "gpt-4o-mini",
                "outcome": "forwarded",
                "status": "200",
                "input_tokens": "420",
                "output_tokens": "80",
                "cost": "0.001850",
                "cost_estimated": "false",
                "retry": "0",
                "duration_ms": "512.000",
                "fingerprint": f"fp-{index % 1000 // 10}",
            }
            writer.writerow([cells.get(column, "") for column in CSV_COLUMNS])


def write_huge_message(path: Path, megabytes: int) -> None:
    """A Telegram Desktop `result.json` of one chat whose second message is `megabytes` MB."""
    text = "a" * (megabytes * 1024**2)
    messages = [
        {
            "id": index,
            "type": "message",
            "date_unixtime": str(START + index),
            "from": "Alice",
            "from_id": "user100",
            "text": text if index == 2 else "hi",
        }
        for index in range(1, 4)
    ]
    chat = {"name": "huge", "type": "private_supergroup", "id": 1, "messages": messages}
    path.write_text(json.dumps(chat), encoding="utf-8")


def replay(paths: list[Path], unit: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one replay per `unit` record."""
    config = parse_config(REPLAY_CONFIG, env={})
    out, err = io.StringIO(), io.StringIO()
    wall, cpu = time.perf_counter(), time.process_time()
    code = run(config, [str(path) for path in paths], as_json=True, out=out, err=err)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if code:
        raise SystemExit(f"replay failed: {err.getvalue()}")
    return cpu / unit, wall / unit


async def pipeline_rate(total: int) -> float:
    """The pipeline's own messages/s (CPU), best of 3 runs, as bench.pipeline_bench measures."""
    bench = Bench(parse_config(CONFIG, env={}))
    rooms = max(1, total // (1 + BOT_MESSAGES_PER_ROOM))
    await timed(bench, bench.through_pipeline, rooms // 10 or 1)
    runs = [await timed(bench, bench.through_pipeline, rooms) for _ in range(3)]
    return 1 / min(run.cpu for run in runs)


def main(messages: int, calls: int, huge_mb: int = 0) -> None:
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as folder:
        export, log = Path(folder) / "general.json", Path(folder) / "calls.csv"
        started = time.perf_counter()
        write_discord(export, messages)
        write_calls(log, calls)
        size_mb = export.stat().st_size / 1e6
        print(f"generated in {time.perf_counter() - started:.1f} s (json backend {ijson.backend})")
        chat_cpu, chat_wall = replay([export], messages)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        call_cpu, call_wall = replay([log], calls)
        if huge_mb:
            huge = Path(folder) / "result.json"
            write_huge_message(huge, huge_mb)
            huge_cpu, _ = replay([huge], 1)
            print(f"replay, one {huge_mb:,} MB message {huge_cpu:>9.2f} CPU s (Telegram export)")
    pipeline = asyncio.run(pipeline_rate(60_000))
    rate = 1 / chat_cpu
    print(f"discord export          {messages:>12,} messages  {size_mb:,.0f} MB")
    print(f"replay, discord         {rate:>12,.0f} msg/s   {chat_cpu * 1e6:8.2f} µs/msg (CPU)")
    print(f"replay, discord, wall   {1 / chat_wall:>12,.0f} msg/s")
    print(f"replay, calls CSV       {1 / call_cpu:>12,.0f} calls/s {call_cpu * 1e6:8.2f} µs/call")
    print(f"replay, calls, wall     {1 / call_wall:>12,.0f} calls/s ({calls:,} calls)")
    print(f"peak memory (RSS)       {rss_mb:>12,.0f} MB      (target < {TARGET_RSS_MB})")
    print(f"pipeline, same run      {pipeline:>12,.0f} msg/s   (bench.pipeline_bench, CPU)")
    verdict = "meets" if rate >= TARGET_RATE and rss_mb < TARGET_RSS_MB else "misses"
    print(f"{verdict} the targets (≥ {TARGET_RATE:,} msg/s, < {TARGET_RSS_MB} MB)")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages in the export")
    parser.add_argument("--calls", type=int, default=100_000, help="rows in the CSV")
    parser.add_argument("--quick", action="store_true", help="a tenth of each")
    parser.add_argument("--huge-mb", type=int, default=0, help="also one message this large")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.calls = args.messages // 10, args.calls // 10
    main(args.messages, args.calls, args.huge_mb)


if __name__ == "__main__":
    cli()
