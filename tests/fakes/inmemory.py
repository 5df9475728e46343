"""An in-memory platform for pipeline tests (errbot `backends/test.py` style).

`InMemoryConnector` is a Connector that records what it sends and can be told to fail
the next sends (e.g. with a 429). `PipelineRig` wires config, memory state, metrics,
admin service, delivery (with a recorded, instant sleep) and the real pipeline around
one connector per configured bot. `InMemoryRoom` is one channel of the fake platform:
a post reaches every hosted bot, and what the bots send is posted back into the room,
so bot-to-bot loops play out exactly as on a real platform, on an injected clock.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from gateway.admin.service import AdminService
from gateway.app.connector import Capabilities, Sink
from gateway.app.context import Agent, TurnContext
from gateway.app.errors import DeliveryError
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.app.types import AgentResult, InboundMessage, Reply
from gateway.config import Config, parse_config
from gateway.delivery.sender import Delivery
from gateway.observability.metrics import Metrics
from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore

_ids = itertools.count(1)


def next_id() -> str:
    """A fresh platform id (message ids, event ids), unique in the test session."""
    return str(next(_ids))


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


@dataclass(frozen=True, slots=True)
class Sent:
    """One chunk a connector sent."""

    channel_id: str
    reply: Reply


class InMemoryConnector:
    """A Connector with no network: inbound via `push`, outbound recorded in `sent`."""

    def __init__(
        self,
        bot_id: str,
        *,
        platform: str = "room",
        bot_user_id: str | None = None,
        max_message_length: int = 2_000,
        knows_bots: bool = True,
        typing: bool = False,
        command_prefix: str = "/loop",
    ) -> None:
        self.name = platform
        self.bot_id = bot_id
        self.capabilities = Capabilities(
            max_message_length=max_message_length,
            knows_bots=knows_bots,
            typing=typing,
            command_prefix=command_prefix,
        )
        self._user_id = bot_user_id or f"U_{bot_id}"
        self._sink: Sink | None = None
        self.sent: list[Sent] = []
        self.failures: deque[Exception] = deque()
        self.send_attempts = 0
        self.typing_calls: list[str] = []
        self.on_send: Callable[[InMemoryConnector, str, Reply], None] | None = None

    @property
    def connected(self) -> bool:
        """True once started."""
        return self._sink is not None

    @property
    def bot_user_id(self) -> str:
        """The hosted bot's platform user id."""
        return self._user_id

    async def start(self, sink: Sink) -> None:
        """Remember where inbound messages go."""
        self._sink = sink

    async def aclose(self) -> None:
        """Stop taking messages."""
        self._sink = None

    def fail_next(self, *errors: Exception) -> None:
        """Make the next sends raise these errors, one per send, in order."""
        self.failures.extend(errors)

    def rate_limit_next(self, retry_after: float, times: int = 1) -> None:
        """Answer the next `times` sends with a 429 asking to wait `retry_after` seconds."""
        self.fail_next(
            *(
                DeliveryError("429 too many requests", retryable=True, retry_after=retry_after)
                for _ in range(times)
            )
        )

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Record a chunk (or raise the next injected failure)."""
        self.send_attempts += 1
        if self.failures:
            raise self.failures.popleft()
        if len(reply.text) > self.capabilities.max_message_length:
            raise DeliveryError("message too long", retryable=False)
        self.sent.append(Sent(channel_id, reply))
        if self.on_send is not None:
            self.on_send(self, channel_id, reply)
        return next_id()

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """Record the typing indicator."""
        self.typing_calls.append(channel_id)

    async def push(self, message: InboundMessage) -> object:
        """Hand one inbound message to the gateway, as the platform would."""
        if self._sink is None:
            raise RuntimeError("connector not started")
        return await self._sink(message)

    def message(
        self,
        text: str,
        *,
        sender_id: str = "U_ALICE",
        sender_name: str = "alice",
        sender_is_bot: bool = False,
        channel_id: str = "C1",
        thread_id: str | None = None,
        message_id: str | None = None,
        event_id: str | None = None,
        mentions_bot: bool = False,
        reply_to_bot: bool = False,
        is_direct: bool = False,
    ) -> InboundMessage:
        """An inbound message as this connector's bot sees it."""
        return InboundMessage(
            platform=self.name,
            bot_id=self.bot_id,
            channel_id=channel_id,
            thread_id=thread_id,
            message_id=message_id or next_id(),
            sender_id=sender_id,
            sender_name=sender_name,
            sender_is_bot=sender_is_bot,
            text=text,
            mentions_bot=mentions_bot,
            reply_to_bot=reply_to_bot,
            is_direct=is_direct,
            bot_user_id=self._user_id,
            event_id=event_id,
        )

    def texts(self) -> list[str]:
        """The text of every chunk sent, in order."""
        return [sent.reply.text for sent in self.sent]


class ConstantAgent:
    """Answers every turn with the same text (None: stays silent); counts its turns."""

    def __init__(self, text: str | None = "pong") -> None:
        self.text = text
        self.turns: list[InboundMessage] = []

    async def respond(self, turn: TurnContext) -> AgentResult:
        """The configured answer."""
        self.turns.append(turn.message)
        return AgentResult(self.text)

    async def aclose(self) -> None:
        """Nothing to close."""


def rig_config(yaml_text: str = "", *, bots: Collection[str] = ("parrot",)) -> Config:
    """A config of room bots (one agent each, named after the bot) plus `yaml_text`."""
    lines = ["agents:"]
    lines += [f"  {bot}: {{kind: scripted, default: pong}}" for bot in bots]
    lines += ["bots:"]
    lines += [f"  - {{id: {bot}, platform: room, agent: {bot}}}" for bot in bots]
    return parse_config("\n".join(lines) + "\n" + yaml_text, env={})


class PipelineRig:
    """The real pipeline around in-memory connectors, memory state and a fake clock.

    `state` and `clock` replace the memory store and the fake clock (a store of another
    backend, driven by that clock).
    """

    def __init__(
        self,
        config: Config,
        agents: Mapping[str, Agent] | None = None,
        *,
        max_message_length: int = 2_000,
        typing: bool = False,
        max_attempts: int = 5,
        command_prefix: str = "/loop",
        state: StateStore | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or FakeClock()
        self.state = state if state is not None else MemoryStateStore(clock=self.clock)
        self.metrics = Metrics()
        self.recent = RecentRefusals(clock=self.clock)
        self.admin = AdminService(config, self.state, recent=self.recent)
        self.waits: list[float] = []
        self.delivery = Delivery(self.metrics, sleep=self._sleep, max_attempts=max_attempts)
        self.handler = build_gateway_pipeline(
            config, state=self.state, admin=self.admin, delivery=self.delivery, recent=self.recent
        )
        given = dict(agents or {})
        self.agents: dict[str, Agent] = {
            bot.id: given.get(bot.id) or given.get(bot.agent) or ConstantAgent()
            for bot in config.bots
        }
        self.connectors = {
            bot.id: InMemoryConnector(
                bot.id,
                platform=bot.platform,
                max_message_length=max_message_length,
                typing=typing,
                command_prefix=command_prefix,
            )
            for bot in config.bots
        }
        self.turns: list[TurnContext] = []

    async def _sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)

    async def start(self) -> None:
        """Start every connector with a sink that runs the pipeline for its bot."""
        for bot_id, connector in self.connectors.items():
            await connector.start(self._sink_for(bot_id))

    def _sink_for(self, bot_id: str) -> Sink:
        async def sink(message: InboundMessage) -> Reply | None:
            turn = self.turn(message, bot_id)
            self.turns.append(turn)
            return await self.handler(turn)

        return sink

    def turn(self, message: InboundMessage, bot_id: str = "parrot") -> TurnContext:
        """The turn of `message` for one hosted bot, as its connector's sink makes it."""
        return TurnContext(
            message=message,
            policy=self.config.policy,
            state=self.state,
            config=self.config,
            bot=self.config.bot(bot_id),
            connector=self.connectors[bot_id],
            agent=self.agents[bot_id],
        )

    def connector(self, bot_id: str = "parrot") -> InMemoryConnector:
        """The connector of one hosted bot."""
        return self.connectors[bot_id]

    def sent(self) -> list[Sent]:
        """Everything any hosted bot sent, bot by bot."""
        return [sent for connector in self.connectors.values() for sent in connector.sent]


@dataclass(frozen=True, slots=True)
class Post:
    """One message in the room's transcript."""

    sender_id: str
    sender_name: str
    is_bot: bool
    text: str
    message_id: str


@dataclass
class InMemoryRoom:
    """One channel of the fake platform: every post reaches every hosted bot.

    What a hosted bot sends is queued and posted back into the room by `run`, one post
    per `step` seconds of the rig's clock, the way a chat platform echoes messages.
    """

    rig: PipelineRig
    channel_id: str = "C1"
    step: float = 1.0
    transcript: list[Post] = field(default_factory=list)
    _queue: deque[Post] = field(default_factory=deque)

    def __post_init__(self) -> None:
        for connector in self.rig.connectors.values():
            connector.on_send = self._on_send

    def _on_send(self, connector: InMemoryConnector, channel_id: str, reply: Reply) -> None:
        if channel_id == self.channel_id:
            post = Post(connector.bot_user_id, connector.bot_id, True, reply.text, next_id())
            self._queue.append(post)

    async def post(
        self,
        text: str,
        *,
        sender_id: str = "U_ALICE",
        sender_name: str = "alice",
        is_bot: bool = False,
        mentions: Collection[str] = (),
    ) -> None:
        """A message from anyone (not a hosted bot): every hosted bot receives it."""
        await self._deliver(Post(sender_id, sender_name, is_bot, text, next_id()), mentions)

    async def _deliver(self, post: Post, mentions: Collection[str] = ()) -> None:
        self.transcript.append(post)
        for connector in self.rig.connectors.values():
            message = connector.message(
                post.text,
                sender_id=post.sender_id,
                sender_name=post.sender_name,
                sender_is_bot=post.is_bot,
                channel_id=self.channel_id,
                message_id=post.message_id,
                mentions_bot=connector.bot_user_id in mentions,
            )
            await connector.push(message)

    async def run(self, max_posts: int = 500) -> int:
        """Post what the bots sent back into the room until quiet; returns posts made."""
        posted = 0
        while self._queue and posted < max_posts:
            self.rig.clock.advance(self.step)
            await self._deliver(self._queue.popleft())
            posted += 1
        return posted

    def bot_posts(self) -> list[Post]:
        """The posts made by bots."""
        return [post for post in self.transcript if post.is_bot]
