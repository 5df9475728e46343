"""The bot directory: each sender asked about once, answers kept (bounded), unknown is a bot."""

from __future__ import annotations

import asyncio

from connectors.mattermost.users import Account, BotDirectory


class _Server:
    """Answers lookups from a table; `gate` holds them so concurrent askers overlap."""

    def __init__(self, answers: dict[str, bool | None]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, user_id: str) -> Account | None:
        self.asked.append(user_id)
        await self.gate.wait()
        is_bot = self.answers.get(user_id)
        return None if is_bot is None else Account(is_bot, user_id)


async def test_issue23_a_sender_is_looked_up_once_even_when_asked_at_once() -> None:
    server = _Server({"bot": True, "alice": False})
    directory = BotDirectory(server)
    server.gate.clear()
    asking = [asyncio.create_task(directory.is_bot("bot")) for _ in range(5)]
    await asyncio.sleep(0)
    server.gate.set()
    assert await asyncio.gather(*asking) == [True] * 5
    assert not await directory.is_bot("alice")
    assert not await directory.is_bot("alice")
    assert server.asked == ["bot", "alice"]


async def test_issue23_an_unanswered_lookup_is_a_bot_and_asked_again_next_time() -> None:
    server = _Server({})
    directory = BotDirectory(server)
    assert await directory.is_bot("ghost")
    server.answers["ghost"] = False
    assert not await directory.is_bot("ghost")
    assert server.asked == ["ghost", "ghost"]


async def test_issue23_the_directory_keeps_at_most_max_users_least_recent_first_out() -> None:
    server = _Server({f"u{i}": False for i in range(4)})
    directory = BotDirectory(server, max_users=2)
    for user in ("u0", "u1", "u0", "u2"):
        await directory.is_bot(user)
    assert len(directory) == 2
    await directory.is_bot("u0")  # kept: asked more recently than u1
    await directory.is_bot("u1")  # forgotten: asked again
    assert server.asked == ["u0", "u1", "u2", "u1"]


async def test_issue23_the_directory_keeps_each_users_name_with_the_bot_flag() -> None:
    server = _Server({"alice": False})
    directory = BotDirectory(server)
    assert await directory.account("alice") == Account(is_bot=False, username="alice")
    assert await directory.account("ghost") is None
    assert not await directory.is_bot("alice")
    assert server.asked == ["alice", "ghost"]
