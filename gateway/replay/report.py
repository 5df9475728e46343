"""What a replay found, three ways: the `--json` object, the text report, the HTML page.

`summary` is the one set of figures (the shape the README documents); the text report
and the HTML page show the same figures. Every text of an export the text report prints
(names, rooms, ids, agents, sessions) goes through `gateway.observability.visible`: control and
escape sequences are shown, not obeyed. The HTML page is one self-contained file: the
figures and each room's timeline inline as JSON (`<`, `>` and `&` escaped, so no text
from an export can close the script element), uPlot and its stylesheet inline, a
Content-Security-Policy that allows no network at all, and every name written with
`textContent`, never as markup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources

from gateway.observability.visible import visible
from gateway.replay.engine import CallReplay, ChatReplay, RoomTally
from gateway.replay.records import iso

Summary = dict[str, object]
_SHOWN_IDS = 10


def summary(chat: ChatReplay, calls: CallReplay, skipped: Mapping[str, int]) -> Summary:
    """The figures of a replay, as `--json` prints them."""
    return {
        "rooms": [_room(room) for room in chat.rooms.values()],
        "calls": {
            "agents": [
                {
                    "agent": agent,
                    "sessions": [
                        {
                            "session": session,
                            "calls": tally.calls,
                            **tally.refusals,
                            "cost_saved_usd": round(tally.cost_saved, 6),
                        }
                        for session, tally in sessions.items()
                    ],
                }
                for agent, sessions in calls.agents.items()
            ]
        },
        "skipped": dict(sorted(skipped.items())),
    }


def _room(room: RoomTally) -> dict[str, object]:
    names = room.bots
    return {
        "room": room.channel,
        "platform": room.platform,
        "messages": room.messages,
        "consecutive_turn_cuts": room.consecutive_turn_cuts,
        "room_budget_cuts": room.room_budget_cuts,
        "room_cooldowns_opened": room.room_cooldowns_opened,
        "pairs": [
            {
                "bots": [names.get(a, a), names.get(b, b)],
                "events": pair.events,
                "refused": pair.refused,
                "cooldowns_opened": pair.cooldowns_opened,
                "first_cooldown_at": (
                    None if pair.first_cooldown_at is None else iso(pair.first_cooldown_at)
                ),
                "refused_message_ids": pair.refused_message_ids,
            }
            for (a, b), pair in sorted(room.pairs.items())
        ],
    }


def text(chat: ChatReplay, calls: CallReplay, skipped: Mapping[str, int]) -> str:
    """The report for a terminal: per room and pair, then calls, then what was skipped."""
    lines: list[str] = []
    for room in chat.rooms.values():
        lines.append(
            f"{room.platform} {visible(room.name)} ({visible(room.channel)}): "
            f"{room.messages:,} messages, {room.consecutive_turn_cuts:,} consecutive-turn cuts"
            + (f", {room.room_budget_cuts:,} room-budget cuts" if room.room_budget_cuts else "")
        )
        for (a, b), pair in sorted(room.pairs.items()):
            first = pair.first_cooldown_at
            lines.append(
                f"  {visible(room.bots.get(a, a))} ↔ {visible(room.bots.get(b, b))}: "
                f"{pair.events:,} events, "
                f"{pair.refused:,} refused, {pair.cooldowns_opened:,} cooldowns opened"
                + ("" if first is None else f" (first at {iso(first)})")
            )
            ids = pair.refused_message_ids[:_SHOWN_IDS]
            if ids:
                more = pair.refused - len(ids)
                lines.append(
                    "    would not have been answered: "
                    + ", ".join(map(visible, ids))
                    + (f" and {more:,} more" if more else "")
                )
    if calls.agents:
        lines.append("calls:")
    for agent, sessions in calls.agents.items():
        for session, tally in sessions.items():
            counts = ", ".join(f"{code} {count:,}" for code, count in tally.refusals.items())
            lines.append(
                f"  {visible(agent)} session {visible(session) or '(none)'}: "
                f"{tally.calls:,} calls, {counts}, "
                f"cost saved {tally.cost_saved:.6f}"
            )
    if skipped:
        lines.append(
            "skipped: " + ", ".join(f"{why} {count:,}" for why, count in sorted(skipped.items()))
        )
    if not lines:
        lines.append("nothing to replay: no message and no call in the inputs")
    return "\n".join(lines) + "\n"


def html(figures: Summary, chat: ChatReplay) -> str:
    """The self-contained HTML report: the figures and a timeline chart per room."""
    rooms = [
        {
            "name": room.name,
            "bucket_seconds": room.timeline.width,
            "timeline": room.timeline.points(),
        }
        for room in chat.rooms.values()
    ]
    data = json.dumps({"summary": figures, "rooms": rooms}, ensure_ascii=False)
    data = data.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    page = (resources.files("gateway.replay") / "static" / "report.html").read_text("utf-8")
    # uPlot is shipped once, in gateway/static, for this report and the console.
    shared = resources.files("gateway") / "static"
    # Each placeholder's first occurrence is the template's own: filled from the last one
    # back, so what is inserted always comes after the placeholders still to fill.
    page = page.replace("/*UPLOT_JS*/", (shared / "uPlot.iife.min.js").read_text("utf-8"), 1)
    page = page.replace("/*DATA*/", data, 1)
    return page.replace("/*UPLOT_CSS*/", (shared / "uPlot.min.css").read_text("utf-8"), 1)
