"""`links:` (issue 23): linked rooms share one scope; hostile links are refused."""

from __future__ import annotations

import pytest

from gateway.admin.service import AdminService
from gateway.app.errors import ConfigError
from gateway.app.middlewares.bot_loop import LINK_PAIR, pair_ids
from gateway.config import parse_config
from gateway.config.links import MAX_LINK_ROOM_CHARS, MAX_LINK_ROOMS, RoomLinks
from gateway.state.memory import MemoryStateStore

MX = "matrix:!abc:example.org"
TG = "telegram:-100123"
MM = "mattermost:town-square-id"
BASE = "agents: {parrot: {kind: scripted, default: hi}}\n"


def test_issue23_a_linked_room_is_scoped_to_its_links_first_room() -> None:
    links = RoomLinks.of([(MX, TG), (MM, "slack:C1")])

    assert links.scope(TG) == MX
    assert links.scope(MX) == MX
    assert links.scope("slack:C1") == MM
    assert links.scope("discord:42") == "discord:42"
    assert links.linked(TG) == (MX, TG)
    assert links.linked("discord:42") == ()
    assert links.rooms() == (MX, TG, MM, "slack:C1")


def test_issue23_links_in_the_config_reach_the_map() -> None:
    config = parse_config(BASE + f"links:\n  - [{MX}, {TG}]\n", env={})

    assert config.links == ((MX, TG),)
    assert config.room_links.scope(TG) == MX


def test_issue23_linked_rooms_charge_one_pair_whoever_the_bots_are() -> None:
    assert pair_ids("@a:example.org", "@relay:example.org", linked=True) == (LINK_PAIR, LINK_PAIR)
    assert pair_ids("7001", "8001", linked=True) == (LINK_PAIR, LINK_PAIR)
    assert pair_ids("7001", "8001", linked=False) == ("7001", "8001")


@pytest.mark.parametrize(
    ("links", "field"),
    [
        ("links: [[matrix:!a:b, 'telegram: -100']]", "links.0.1"),  # a space after the colon
        ("links: [[matrix:!a:b, {telegram: -100}]]", "links.0.1"),  # YAML read it as a mapping
        ("links: [[matrix:!a:b, irc:x]]", "links.0.1"),
        ("links: [[matrix:!a:b, telegram:１２３]]", "links.0.1"),  # full-width digits
        ('links: [[matrix:!a:b, "telegram:1\\u200b"]]', "links.0.1"),  # zero-width space
        ('links: [[matrix:!a:b, "telegram:1\\n"]]', "links.0.1"),
        ("links: [[matrix:!a:b, telegram]]", "links.0.1"),
        (f"links: [[matrix:!a:b, telegram:{'9' * MAX_LINK_ROOM_CHARS}]]", "links.0.1"),
        ("links: [[matrix:!a:b]]", "links.0"),
        (f"links: [[{', '.join(f'slack:C{n}' for n in range(MAX_LINK_ROOMS + 1))}]]", "links.0"),
        ("links: [[matrix:!a:b, telegram:1], [telegram:1, slack:C1]]", "links.1.0"),
        ("links: [[matrix:!a:b, matrix:!a:b]]", "links.0.1"),
        ("links: matrix:!a:b", "links"),
    ],
)
def test_issue23_hostile_links_are_refused_naming_the_field(links: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE + links, env={})

    assert field in str(caught.value)
    assert "9" * 50 not in str(caught.value)


async def test_issue23_admin_commands_on_one_linked_room_act_on_the_link() -> None:
    config = parse_config(BASE + f"links:\n  - [{MX}, {TG}]\n", env={})
    state = MemoryStateStore()
    admin = AdminService(config, state)

    await admin.pause(TG, 600)
    await admin.set(MX, "bot_loop.max_events_per_window", "3")

    assert await state.pause_remaining(MX) is not None
    assert (await admin.effective_policy(TG)).bot_loop.max_events_per_window == 3
    status = await admin.status(TG)
    assert f"Linked with: {MX}" in status
    assert "Paused: yes" in status
    data = (await admin.status_ack(MX)).data
    assert data is not None
    assert data["linked"] == [TG]
    await admin.resume(MX)
    assert await state.pause_remaining(TG) is None
    assert "Paused: no" in await admin.status(TG)
    assert "Linked with" not in await admin.status("discord:42")


async def test_issue23_reset_in_one_linked_room_clears_the_links_pair_and_turns() -> None:
    config = parse_config(BASE + f"links:\n  - [{MX}, {TG}]\n", env={})
    state = MemoryStateStore()
    admin = AdminService(config, state)
    policy = (await admin.effective_policy(MX)).bot_loop.guard_policy()
    await state.pair_decide(scope=MX, self_bot_id=LINK_PAIR, sender_bot_id=LINK_PAIR, policy=policy)
    await state.bot_turn(MX, is_bot=True, message_key="m1")

    await admin.reset(TG)

    assert await state.pair_snapshot(MX) == []
    assert await state.bot_turns_peek(MX) == 0
