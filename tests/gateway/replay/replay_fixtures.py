"""Exports written by the tests, shaped exactly as each exporter writes them.

DiscordChatExporter: `guild`, `channel`, `messages[]` (every field the exporter writes,
bots marked with `isBot`), `messageCount`. Slack: `channels.json`, `users.json` and
`<channel>/<YYYY-MM-DD>.json`, with `bot_message` subtypes, thread replies and joins.
Telegram Desktop: `result.json` of one chat or of the whole account (`chats.list[]`),
`text` as a string or a list of entities, service messages, `from_id: user123`.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.cli.main import main

START = 1_704_110_400  # 2024-01-01T12:00:00Z

CONFIG = """
policy:
  bot_loop:
    max_events_per_window: 3
    window_seconds: 60
    cooldown_seconds: 30
    max_consecutive_bot_turns: 0
"""


def iso(offset: float, *, zone: str = "+00:00") -> str:
    """The exporter's timestamp `offset` seconds after START."""
    moment = datetime.fromtimestamp(START + offset, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", zone)


def discord_author(user_id: str, name: str, *, bot: bool) -> dict[str, object]:
    """An author object as DiscordChatExporter writes it."""
    return {
        "id": user_id,
        "name": name,
        "discriminator": "0000",
        "nickname": name,
        "color": None,
        "isBot": bot,
        "roles": [],
        "avatarUrl": "https://cdn.discordapp.com/embed/avatars/0.png",
    }


def discord_message(
    message_id: str,
    offset: float,
    author: Mapping[str, object],
    content: str,
    *,
    kind: str = "Default",
    mentions: Sequence[Mapping[str, object]] = (),
) -> dict[str, object]:
    """A message object as DiscordChatExporter writes it."""
    return {
        "id": message_id,
        "type": kind,
        "timestamp": iso(offset),
        "timestampEdited": None,
        "callEndedTimestamp": None,
        "isPinned": False,
        "content": content,
        "author": dict(author),
        "attachments": [],
        "embeds": [],
        "stickers": [],
        "reactions": [],
        "mentions": [dict(found) for found in mentions],
        "inlineEmojis": [],
    }


def write_discord(
    path: Path,
    messages: Sequence[Mapping[str, object]],
    *,
    channel_id: str = "800",
    name: str = "general",
    kind: str = "GuildTextChat",
    parent: str | None = None,
) -> Path:
    """A DiscordChatExporter file of one channel (or thread, with its parent)."""
    document = {
        "guild": {"id": "700", "name": "Bots Inc", "iconUrl": "https://cdn/icon.png"},
        "channel": {
            "id": channel_id,
            "type": kind,
            "categoryId": parent,
            "category": "general" if parent else "Text Channels",
            "name": name,
            "topic": None,
        },
        "dateRange": {"after": None, "before": None},
        "exportedAt": "2024-01-02T00:00:00+00:00",
        "messages": list(messages),
        "messageCount": len(messages),
    }
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return path


def ping_pong_discord(path: Path, rounds: int = 8) -> Path:
    """A person, then two bots answering each other `rounds` times, a second apart."""
    alice = discord_author("111", "alice", bot=False)
    ping = discord_author("222", "PingBot", bot=True)
    pong = discord_author("333", "PongBot", bot=True)
    messages = [discord_message("1000", 0, alice, "hello bots")]
    for index in range(rounds):
        messages.append(
            discord_message(str(1001 + index), 1 + index, (ping, pong)[index % 2], "again!")
        )
    return write_discord(path, messages)


@dataclass(frozen=True)
class SlackExport:
    """A Slack workspace export's files: path inside the export → JSON value."""

    files: Mapping[str, object]

    def folder(self, root: Path) -> Path:
        """Written as a folder."""
        for name, value in self.files.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(value, indent=4), encoding="utf-8")
        return root

    def zip(self, path: Path) -> Path:
        """Written as the zip Slack hands out."""
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, value in self.files.items():
                archive.writestr(name, json.dumps(value, indent=4))
        return path


def slack_ts(offset: float, sequence: int = 0) -> str:
    """A Slack `ts`: seconds with six decimals."""
    return f"{START + offset:.0f}.{sequence:06d}"


def slack_export() -> SlackExport:
    """#bots: a person, a bot user and a legacy integration (`bot_message`) in a thread."""
    parent = slack_ts(0)
    day = [
        {
            "type": "message",
            "subtype": "channel_join",
            "ts": slack_ts(-5),
            "user": "U0ALICE",
            "text": "<@U0ALICE> has joined the channel",
        },
        {
            "type": "message",
            "ts": parent,
            "user": "U0ALICE",
            "text": "hi <@U0PING>",
            "team": "T1",
            "user_profile": {"display_name": "alice", "real_name": "Alice A"},
        },
    ]
    for index in range(6):
        ts = slack_ts(1 + index)
        if index % 2 == 0:
            day.append(
                {
                    "type": "message",
                    "ts": ts,
                    "user": "U0PING",
                    "bot_id": "B0PING",
                    "text": "ping",
                    "thread_ts": parent,
                    "parent_user_id": "U0ALICE",
                    "bot_profile": {"id": "B0PING", "name": "pingbot"},
                }
            )
        else:
            day.append(
                {
                    "type": "message",
                    "subtype": "bot_message",
                    "ts": ts,
                    "bot_id": "B0HOOK",
                    "username": "hookbot",
                    "text": "pong",
                    "thread_ts": parent,
                }
            )
    day.append(
        {
            "type": "message",
            "subtype": "pinned_item",
            "ts": slack_ts(20),
            "user": "U0ALICE",
            "text": "pinned a message",
        }
    )
    day.append(
        {
            "type": "message",
            "subtype": "huddle_weird_new_thing",
            "ts": slack_ts(21),
            "user": "U0ALICE",
            "text": "?",
        }
    )
    day.append({"type": "message", "ts": slack_ts(22), "user": "U0ALICE", "text": ""})
    return SlackExport(
        {
            "channels.json": [
                {
                    "id": "C0BOTS",
                    "name": "bots",
                    "created": START,
                    "creator": "U0ALICE",
                    "members": ["U0ALICE", "U0PING"],
                }
            ],
            "users.json": [
                {
                    "id": "U0ALICE",
                    "name": "alice",
                    "real_name": "Alice A",
                    "is_bot": False,
                    "profile": {"display_name": "alice", "real_name": "Alice A"},
                },
                {
                    "id": "U0PING",
                    "name": "pingbot",
                    "is_bot": True,
                    "profile": {"display_name": "", "real_name": "pingbot", "bot_id": "B0PING"},
                },
            ],
            "bots/2024-01-01.json": day,
        }
    )


def telegram_message(
    message_id: int,
    offset: float,
    sender: str,
    from_id: str,
    text: str | Sequence[str | Mapping[str, str]],
) -> dict[str, object]:
    """A message as Telegram Desktop writes it."""
    plain = (
        text
        if isinstance(text, str)
        else "".join(part if isinstance(part, str) else part["text"] for part in text)
    )
    return {
        "id": message_id,
        "type": "message",
        "date": datetime.fromtimestamp(START + offset, UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        "date_unixtime": str(int(START + offset)),
        "from": sender,
        "from_id": from_id,
        "text": text,
        "text_entities": [{"type": "plain", "text": plain}],
    }


def telegram_chat(chat_id: int = 1234567890, rounds: int = 6) -> dict[str, object]:
    """A supergroup where a person pings two bots, who then answer each other."""
    messages: list[dict[str, object]] = [
        {
            "id": 1,
            "type": "service",
            "date": "2024-01-01T11:59:00",
            "date_unixtime": str(START - 60),
            "actor": "Alice",
            "actor_id": "user100",
            "action": "invite_members",
            "members": ["Ping Bot"],
            "text": "",
            "text_entities": [],
        },
        telegram_message(
            2,
            0,
            "Alice",
            "user100",
            ["hi ", {"type": "mention", "text": "@ping_bot"}, " and friends"],
        ),
    ]
    for index in range(rounds):
        sender, from_id = ("Ping Bot", "user200") if index % 2 == 0 else ("Pong", "user300")
        text: str | list[str | dict[str, str]] = (
            "pong" if index % 2 else [{"type": "bold", "text": "PING"}, "!"]
        )
        messages.append(telegram_message(3 + index, 1 + index, sender, from_id, text))
    messages.append(telegram_message(20, 30, "Alice", "user100", ""))
    return {"name": "Bot lab", "type": "private_supergroup", "id": chat_id, "messages": messages}


def telegram_account(chats: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """The whole-account `result.json`."""
    return {
        "about": "Here is the data you requested.",
        "personal_information": {"user_id": 100, "first_name": "Alice"},
        "chats": {"about": "This page lists all chats from this export.", "list": list(chats)},
        "left_chats": {"about": "This page lists all chats you left.", "list": []},
    }


def replay_cli(*args: str) -> tuple[int, str, str]:
    """Run `loopwarden replay ARGS`; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["replay", *args])
    return code, out.getvalue(), err.getvalue()


def replay_json(config: Path, *inputs: str | Path, extra: Sequence[str] = ()) -> Any:
    """The `--json` figures of a replay that must succeed (JSON: read as the tests please)."""
    code, out, err = replay_cli("--config", str(config), *map(str, inputs), "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def write_config(folder: Path, text: str = CONFIG) -> Path:
    """A config file in `folder`."""
    path = folder / "loopwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return path
