"""A Telegram group on the fake where two bots see each other's posts, as bots do via peers.

Telegram never delivers a bot's message to other bots; `relay` makes the fake do so (each
post is delivered to every other member bot), which is the loop a guard must stop.
"""

from __future__ import annotations

from tests.fakes.telegram_server import FakeChat, FakeUser, SentMessage, TelegramFake

PARROT_TOKEN = "1001:AAparrot-token-integration"
ECHO_TOKEN = "1002:AAecho-token-integration"
PARROT_ID, ECHO_ID = "1001", "1002"
GROUP = FakeChat(-100500, "supergroup", title="bots")
ALICE = FakeUser(7, "Alice", "alice")


def setup(fake: TelegramFake) -> None:
    """Both bots, in one group, each seeing what the other posts."""
    fake.add_bot(PARROT_TOKEN, int(PARROT_ID), "parrot_bot")
    fake.add_bot(ECHO_TOKEN, int(ECHO_ID), "echo_bot")
    fake.add_chat(GROUP, PARROT_TOKEN, ECHO_TOKEN)

    def relay(sent: SentMessage) -> None:
        message = fake.messages[(sent.chat_id, sent.message_id)]
        for token in fake.members[sent.chat_id] - {sent.token}:
            fake.deliver(token, {"message": message})

    fake.on_send = relay


def kickoff(fake: TelegramFake, text: str = "hello") -> None:
    """Echo greets Parrot once (a bot message only Parrot receives): the first exchange."""
    echo = fake.bots[ECHO_TOKEN].user
    message = fake.build_message(GROUP, echo, text)
    fake.deliver(PARROT_TOKEN, {"message": message})


def texts(fake: TelegramFake) -> list[str]:
    """What the bots posted in the group, in order."""
    return [sent.text for sent in fake.sent_to(GROUP.id)]
