"""PeerBus: hosted bots of one platform offer each other what they posted, nothing shared."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.app.connector import PeerBus


@dataclass(eq=False)
class Listener:
    name: str
    received: list[object] = field(default_factory=list)

    def receive_peer(self, event: object) -> None:
        self.received.append(event)


def test_issue10_publish_reaches_every_other_subscriber_of_that_platform_only() -> None:
    bus = PeerBus()
    parrot, echo, quiet, slack = (Listener(n) for n in ("parrot", "echo", "quiet", "slack"))
    for peer in (parrot, echo, quiet):
        bus.subscribe("telegram", peer)
    bus.subscribe("telegram", echo)  # subscribing twice changes nothing
    bus.subscribe("slack", slack)
    assert bus.publish("telegram", parrot, "hello") == 2
    assert (parrot.received, echo.received, quiet.received) == ([], ["hello"], ["hello"])
    assert slack.received == []
    bus.unsubscribe("telegram", quiet)
    bus.unsubscribe("telegram", quiet)  # a no-op the second time
    bus.unsubscribe("discord", parrot)  # never subscribed there: a no-op
    assert bus.publish("telegram", echo, "back") == 1
    assert parrot.received == ["back"]
    assert quiet.received == ["hello"]
    assert bus.subscribers("telegram") == (parrot, echo)
    assert bus.subscribers("room") == ()


def test_issue10_a_peer_may_unsubscribe_while_it_is_offered_an_event() -> None:
    bus = PeerBus()

    @dataclass(eq=False)
    class Leaving(Listener):
        def receive_peer(self, event: object) -> None:
            super().receive_peer(event)
            bus.unsubscribe("telegram", self)

    sender, leaving, staying = Listener("sender"), Leaving("leaving"), Listener("staying")
    for peer in (sender, leaving, staying):
        bus.subscribe("telegram", peer)
    assert bus.publish("telegram", sender, "one") == 2
    assert staying.received == ["one"]
    assert bus.subscribers("telegram") == (sender, staying)
