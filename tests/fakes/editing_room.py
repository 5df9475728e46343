"""An in-memory platform whose messages can be edited, for unit tests of streamed replies."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gateway.app.connector import Capabilities
from gateway.app.types import Reply


@dataclass
class EditingRoom:
    """An in-memory platform whose messages can be edited: what each reads, every call made."""

    name: str = "memory"
    bot_id: str = "bot-1"
    capabilities: Capabilities = Capabilities(max_message_length=2000, edits=True)
    texts: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    failures: deque[Exception] = field(default_factory=deque)

    @property
    def connected(self) -> bool:
        return True

    @property
    def bot_user_id(self) -> str:
        return self.bot_id

    async def start(self, sink: object) -> None:
        """Nothing to connect."""

    def fail_next(self, *errors: Exception) -> None:
        """Make the next posts or edits raise these errors, one per call, in order."""
        self.failures.extend(errors)

    async def send(self, channel_id: str, reply: Reply) -> str:
        """Post a message (or raise the next injected failure); its id."""
        if self.failures:
            raise self.failures.popleft()
        message_id = str(len(self.texts) + 1)
        self.texts[message_id] = reply.text
        self.calls.append(("send", reply.text))
        return message_id

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Change a message's text (or raise the next injected failure)."""
        if self.failures:
            raise self.failures.popleft()
        self.texts[message_id] = reply.text
        self.calls.append(("edit", reply.text))

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """No indicator."""

    async def aclose(self) -> None:
        """Nothing to close."""
