"""The `http` agent against real aiohttp services on loopback, through the real pipeline."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest
import yaml
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.agents.factory import build_agent
from gateway.agents.http import (
    IDEMPOTENCY_HEADER,
    MAX_ANSWER_BYTES,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    HttpAgent,
    sign,
    verify_signature,
)
from gateway.app import messages
from gateway.app.errors import ConfigError
from gateway.app.types import HistoryEntry
from gateway.cli.main import main
from gateway.config import Config, HttpAgentConfig, parse_config
from tests.fakes.inmemory import InMemoryConnector, PipelineRig
from tests.fakes.loopback import serve_loopback
from tests.gateway.agents.agent_turns import SleepRecorder, make_turn

SECRET = "hmac-secret-0123456789"
NOW = 1_700_000_000.0

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Received:
    """One request the service got: its headers and raw body."""

    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def payload(self) -> dict[str, object]:
        """The body as JSON."""
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def reply(text: str | None) -> Answer:
    """200 `{"reply": text}`."""

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.json_response({"reply": text})

    return answer


def status(code: int, headers: Mapping[str, str] | None = None) -> Answer:
    """An empty answer with this status."""

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers=headers)

    return answer


def raw(body: bytes) -> Answer:
    """200 with exactly these bytes as a JSON body."""

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return answer


async def streamed_10mb(request: web.Request) -> web.StreamResponse:
    """200 with 10 MB sent in chunks and no Content-Length (nothing declares the size)."""
    response = web.StreamResponse()
    response.enable_chunked_encoding()
    await response.prepare(request)
    chunk = b" " * 65_536
    try:
        for _ in range(160):
            await response.write(chunk)
    except ConnectionResetError:  # the agent stops reading past its cap
        pass
    return response


class Service:
    """A service on 127.0.0.1 that records each turn and answers with the next queued answer.

    Once the queue is empty it answers `{"reply": "fine"}`. `stall` answers only when the
    test ends, for timeouts.
    """

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.answers: deque[Answer] = deque()
        self.elsewhere_hits = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.elsewhere = ""

    def answer(self, *answers: Answer) -> None:
        """Queue answers for the next requests, in order."""
        self.answers.extend(answers)

    async def stall(self, _: web.Request) -> web.StreamResponse:
        """Answer nothing until the test is over."""
        await self._release.wait()
        return web.Response(status=204)

    async def _turn(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Received(request.headers, await request.read()))
        answer = self.answers.popleft() if self.answers else reply("fine")
        return await answer(request)

    async def _elsewhere(self, _: web.Request) -> web.StreamResponse:
        self.elsewhere_hits += 1
        return web.json_response({"reply": "followed the redirect"})

    async def __aenter__(self) -> Service:
        app = web.Application()
        app.router.add_post("/turn", self._turn)
        app.router.add_route("*", "/elsewhere", self._elsewhere)
        self._runner = web.AppRunner(app)
        port = await serve_loopback(self._runner)
        self.url = f"http://127.0.0.1:{port}/turn"
        self.elsewhere = f"http://127.0.0.1:{port}/elsewhere"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    async with Service() as running:
        yield running


@pytest.fixture
def sleep() -> SleepRecorder:
    return SleepRecorder()


def _config(url: str, **fields: object) -> Config:
    """A config with one room bot, `parrot`, answered by the http agent `relay`."""
    agent = {"kind": "http", "url": url, "secret": SECRET, **fields}
    bots = [{"id": "parrot", "platform": "room", "agent": "relay"}]
    return parse_config(yaml.safe_dump({"agents": {"relay": agent}, "bots": bots}), env={})


def _agent(config: Config, sleep: SleepRecorder, clock: Callable[[], float]) -> HttpAgent:
    agent_config = config.agents["relay"]
    assert isinstance(agent_config, HttpAgentConfig)
    return HttpAgent("relay", agent_config, sleep=sleep, clock=clock)


@dataclass
class Hosted:
    """The real pipeline around an http agent, as the hosted bot `parrot`."""

    rig: PipelineRig
    agent: HttpAgent

    @property
    def connector(self) -> InMemoryConnector:
        """The bot's connector: push messages in, read what it sent."""
        return self.rig.connector()

    async def say(self, text: str, *, mentions_bot: bool = False) -> list[str]:
        """Post one message to the bot; everything the bot has sent so far."""
        connector = self.connector
        await connector.push(connector.message(text, mentions_bot=mentions_bot))
        return connector.texts()


@pytest.fixture
async def hosted_factory(
    sleep: SleepRecorder,
) -> AsyncIterator[Callable[..., Awaitable[Hosted]]]:
    agents: list[HttpAgent] = []

    async def host(
        url: str, *, clock: Callable[[], float] = lambda: NOW, **fields: object
    ) -> Hosted:
        config = _config(url, **fields)
        agent = _agent(config, sleep, clock)
        agents.append(agent)
        rig = PipelineRig(config, {"parrot": agent})
        await rig.start()
        return Hosted(rig, agent)

    yield host
    for agent in agents:
        await agent.aclose()


HostFactory = Callable[..., Awaitable[Hosted]]


def _signed(request: Received, *, now: float = NOW) -> bool:
    return verify_signature(SECRET, request.headers, request.body, now=now)


# The wire: payload, signature, idempotency key


async def test_issue11_turn_is_posted_signed_with_its_payload_and_history(
    service: Service, sleep: SleepRecorder
) -> None:
    agent = _agent(_config(service.url), sleep, lambda: NOW)
    turn = make_turn("hello there", thread_id="t9")
    turn.history = (
        HistoryEntry("user", "bob", "earlier"),
        HistoryEntry("assistant", "bot-1", "hi"),
    )
    try:
        result = await agent.respond(turn)
    finally:
        await agent.aclose()
    assert result.text == "fine"
    (request,) = service.requests
    assert _signed(request)
    assert request.headers[TIMESTAMP_HEADER] == str(int(NOW))
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers[IDEMPOTENCY_HEADER] == "bot-1:room:c1:m1"
    assert request.payload == {
        "bot": "bot-1",
        "room": "room:c1",
        "thread": "t9",
        "message": {
            "id": "m1",
            "sender_id": "u-alice",
            "sender_name": "alice",
            "sender_is_bot": False,
            "text": "hello there",
            "mentions_bot": False,
            "is_direct": False,
        },
        "history": [
            {"role": "user", "name": "bob", "text": "earlier"},
            {"role": "assistant", "name": "bot-1", "text": "hi"},
        ],
    }


async def test_issue11_reply_is_delivered_through_the_pipeline(
    service: Service, hosted_factory: HostFactory
) -> None:
    service.answer(reply("hello from the service"))
    hosted = await hosted_factory(service.url)
    assert await hosted.say("hi", mentions_bot=True) == ["hello from the service"]
    assert _signed(service.requests[0])
    assert service.requests[0].payload["bot"] == "parrot"


async def test_issue11_text_that_is_not_valid_unicode_still_goes_out(
    service: Service, sleep: SleepRecorder
) -> None:
    agent = _agent(_config(service.url), sleep, lambda: NOW)
    try:
        result = await agent.respond(make_turn("half a pair \ud83d and ü"))
    finally:
        await agent.aclose()
    assert result.text == "fine"
    (request,) = service.requests
    assert request.body.isascii()
    assert _signed(request)
    message = request.payload["message"]
    assert isinstance(message, dict)
    assert message["text"] == "half a pair \ud83d and ü"


async def test_issue11_5xx_is_retried_then_one_reply_is_delivered(
    service: Service, hosted_factory: HostFactory, sleep: SleepRecorder
) -> None:
    ticks = iter(range(int(NOW), int(NOW) + 100, 7))
    service.answer(status(500), status(503), reply("third time lucky"))
    hosted = await hosted_factory(service.url, clock=lambda: float(next(ticks)), max_attempts=3)
    assert await hosted.say("hi") == ["third time lucky"]
    assert len(service.requests) == 3
    assert sleep.waits == [0.5, 1.0]
    assert {r.headers[IDEMPOTENCY_HEADER] for r in service.requests} == {
        service.requests[0].headers[IDEMPOTENCY_HEADER]
    }
    assert {r.body for r in service.requests} == {service.requests[0].body}
    # each attempt is signed afresh, so a retry after a backoff is still inside the tolerance
    stamps = [int(r.headers[TIMESTAMP_HEADER]) for r in service.requests]
    assert stamps == [int(NOW), int(NOW) + 7, int(NOW) + 14]
    assert all(_signed(r, now=stamp) for r, stamp in zip(service.requests, stamps, strict=True))


async def test_issue11_5xx_every_time_ends_with_a_notice_naming_the_agent(
    service: Service,
    hosted_factory: HostFactory,
    sleep: SleepRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service.answer(status(502), status(502))
    hosted = await hosted_factory(service.url, max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        assert await hosted.say("hi") == [messages.HTTP_AGENT_DOWN]
    assert len(service.requests) == 2
    assert sleep.waits == [0.5]
    origin = service.url.removesuffix("/turn")
    assert caplog.messages == [
        f"agent relay: {origin} answered HTTP 502 (attempt 2 of 2); the turn ends with a notice"
    ]
    assert await hosted.say("again") == [messages.HTTP_AGENT_DOWN, "fine"]


@pytest.mark.parametrize("answer", [reply(None), status(204)], ids=["null", "204"])
@pytest.mark.parametrize(("addressed", "posted"), [(False, []), (True, [messages.SILENCE_NOTICE])])
async def test_issue11_null_or_204_is_silence(
    service: Service,
    hosted_factory: HostFactory,
    answer: Answer,
    addressed: bool,
    posted: list[str],
) -> None:
    service.answer(answer)
    hosted = await hosted_factory(service.url)
    assert await hosted.say("thanks all", mentions_bot=addressed) == posted
    assert len(service.requests) == 1


async def test_issue11_silence_token_in_a_reply_is_filtered(
    service: Service, hosted_factory: HostFactory
) -> None:
    service.answer(reply("NO_REPLY"))
    hosted = await hosted_factory(service.url)
    assert await hosted.say("chatter") == []


# Bad answers: a short notice, a log line naming the agent, the next message answered

DEEP = b'{"reply": ' + b"[" * 1_000 + b"]" * 1_000 + b"}"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (raw(b" " * (10 * 1024 * 1024)), f"body is larger than {MAX_ANSWER_BYTES} bytes"),
        (streamed_10mb, f"body is larger than {MAX_ANSWER_BYTES} bytes"),
        (raw(b"{not json"), "not JSON"),
        (raw(b""), "not JSON"),
        (raw(b'{"reply": 42}'), '"reply" of type int'),
        (raw(b'{"reply": ["a", "b"]}'), '"reply" of type list'),
        (raw(b'{"reply": {"text": "hi"}}'), '"reply" of type dict'),
        (raw(b'{"reply": true}'), '"reply" of type bool'),
        (raw(b'["hi"]'), 'other than {"reply": ...}'),
        (raw(b'{"text": "hi"}'), 'other than {"reply": ...}'),
        (raw(DEEP), "nested deeper than 64 levels"),
        (raw(b"[" * 100_000), "nested deeper than 64 levels"),
        (raw(b'{"reply": ' + b"9" * 5_000 + b"}"), "not acceptable JSON"),
        (raw(b'{"reply": 1e999}'), "out of range"),
        (raw(b'{"reply": NaN}'), "NaN is not a JSON number"),
        (raw(b'{"reply": "caf\xe9"}'), "body is not UTF-8"),
        (status(404), "answered HTTP 404 (expected 200 or 204)"),
        (status(429, {"Retry-After": "1"}), "answered HTTP 429"),
        (status(202), "answered HTTP 202"),
    ],
    ids=[
        "10mb-declared",
        "10mb-streamed",
        "invalid-json",
        "empty-body",
        "number",
        "list",
        "object",
        "boolean",
        "top-level-list",
        "no-reply-key",
        "deep-reply",
        "deep-document",
        "5000-digits",
        "overflowing-float",
        "nan",
        "not-utf8",
        "404",
        "429",
        "202",
    ],
)
async def test_issue11_bad_answer_is_a_notice_then_the_next_message_is_answered(
    service: Service,
    hosted_factory: HostFactory,
    caplog: pytest.LogCaptureFixture,
    answer: Answer,
    reason: str,
) -> None:
    service.answer(answer)
    hosted = await hosted_factory(service.url)
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        assert await hosted.say("hi", mentions_bot=True) == [messages.HTTP_AGENT_DOWN]
    assert len(service.requests) == 1  # not retried
    (line,) = caplog.messages
    assert line.startswith("agent relay: http://127.0.0.1:")
    assert reason in line
    assert SECRET not in caplog.text
    assert await hosted.say("and now?") == [messages.HTTP_AGENT_DOWN, "fine"]
    assert hosted.rig.metrics.value("errors_total", stage="agent_dispatch") == 0


async def test_issue11_redirects_are_not_followed(
    service: Service, hosted_factory: HostFactory, caplog: pytest.LogCaptureFixture
) -> None:
    for code in (301, 302, 307, 308):
        service.answer(status(code, {"Location": service.elsewhere}))
    hosted = await hosted_factory(service.url)
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        for _ in range(4):
            await hosted.say("hi")
    assert hosted.connector.texts() == [messages.HTTP_AGENT_DOWN] * 4
    assert service.elsewhere_hits == 0
    assert len(service.requests) == 4
    assert all("which is not followed; set url to the final address" in m for m in caplog.messages)
    assert service.elsewhere not in caplog.text


async def test_issue11_slow_service_times_out_is_retried_then_a_notice(
    service: Service,
    hosted_factory: HostFactory,
    sleep: SleepRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service.answer(service.stall, service.stall)
    hosted = await hosted_factory(service.url, timeout=0.05, max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        assert await hosted.say("hi") == [messages.HTTP_AGENT_DOWN]
    assert len(service.requests) == 2
    assert sleep.waits == [0.5]
    (line,) = caplog.messages
    assert "did not answer within 0.05 s (attempt 2 of 2)" in line
    assert await hosted.say("still there?") == [messages.HTTP_AGENT_DOWN, "fine"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_issue11_refused_connection_is_retried_then_a_notice(
    hosted_factory: HostFactory, sleep: SleepRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    hosted = await hosted_factory(f"http://127.0.0.1:{_closed_port()}/turn", max_attempts=3)
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        assert await hosted.say("hi") == [messages.HTTP_AGENT_DOWN]
    assert sleep.waits == [0.5, 1.0]
    (line,) = caplog.messages
    assert "connection failed (ClientConnectorError) (attempt 3 of 3)" in line


async def test_issue11_url_path_is_not_logged(
    service: Service, hosted_factory: HostFactory, caplog: pytest.LogCaptureFixture
) -> None:
    service.answer(status(400))
    hosted = await hosted_factory(service.url + "?token=webhook-path-token")
    with caplog.at_level(logging.WARNING, logger="loopwarden.agents.http"):
        await hosted.say("hi")
    assert "webhook-path-token" not in caplog.text
    assert "/turn" not in caplog.text


# verify_signature, for receivers


def _headers(body: bytes, *, at: float = NOW, secret: str = SECRET) -> dict[str, str]:
    timestamp = str(int(at))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: sign(secret, timestamp, body)}


BODY = b'{"bot":"parrot"}'


def test_issue11_verify_signature_accepts_a_fresh_signed_request() -> None:
    headers = _headers(BODY)
    assert verify_signature(SECRET, headers, BODY, now=NOW)
    assert verify_signature(SECRET.encode(), headers, BODY.decode(), now=NOW + 300)
    lowered = {key.lower(): value for key, value in headers.items()}
    assert verify_signature(SECRET, lowered, BODY, now=NOW)
    assert verify_signature(SECRET, CIMultiDictProxy(CIMultiDict(headers)), BODY, now=NOW)


def test_issue11_signature_is_hmac_sha256_of_version_timestamp_body() -> None:
    mac = hmac.new(SECRET.encode(), b"v1:1700000000:" + BODY, hashlib.sha256)
    expected = "v1=" + mac.hexdigest()
    assert sign(SECRET, "1700000000", BODY) == expected


def _tampered() -> Iterator[tuple[str, Mapping[str, str], bytes]]:
    good = _headers(BODY)
    yield "wrong secret", _headers(BODY, secret="another-secret-0123456"), BODY
    yield "body changed", good, BODY + b" "
    yield "no timestamp", {SIGNATURE_HEADER: good[SIGNATURE_HEADER]}, BODY
    yield "no signature", {TIMESTAMP_HEADER: good[TIMESTAMP_HEADER]}, BODY
    yield "stale (replay)", _headers(BODY, at=NOW - 301), BODY
    yield "from the future", _headers(BODY, at=NOW + 301), BODY
    yield "look-alike digits", {**good, TIMESTAMP_HEADER: "１７００００００００"}, BODY
    yield "signed sign", {**good, TIMESTAMP_HEADER: "+1700000000"}, BODY
    yield "5000 digits", {**good, TIMESTAMP_HEADER: "9" * 5_000}, BODY
    yield "not a number", {**good, TIMESTAMP_HEADER: "soon"}, BODY
    yield "non-ascii signature", {**good, SIGNATURE_HEADER: "v1=é\ud800"}, BODY
    yield "bare hex", {**good, SIGNATURE_HEADER: good[SIGNATURE_HEADER][3:]}, BODY
    yield "empty", {}, BODY
    twice = CIMultiDict(good)
    twice.add(SIGNATURE_HEADER.lower(), good[SIGNATURE_HEADER])
    yield "signature twice", CIMultiDictProxy(twice), BODY
    yield "two spellings", {**good, SIGNATURE_HEADER.upper(): good[SIGNATURE_HEADER]}, BODY


@pytest.mark.parametrize(("case", "headers", "body"), list(_tampered()), ids=lambda v: str(v)[:20])
def test_issue11_verify_signature_refuses(
    case: str, headers: Mapping[str, str], body: bytes
) -> None:
    assert not verify_signature(SECRET, headers, body, now=NOW), case


def test_issue11_verify_signature_refuses_a_nan_tolerance() -> None:
    assert not verify_signature(SECRET, _headers(BODY), BODY, tolerance=float("nan"), now=NOW)


# Config: check-config names the field


GOOD = {"url": "https://agent.example/turn", "secret": SECRET}


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        ({"secret": SECRET}, "agents.relay.url", "required field is missing"),
        ({**GOOD, "url": "ftp://agent.example/"}, "agents.relay.url", "http:// or https://"),
        ({**GOOD, "url": "agent.example/turn"}, "agents.relay.url", "http:// or https://"),
        ({**GOOD, "url": "http:///turn"}, "agents.relay.url", "with a host"),
        ({**GOOD, "url": "һttps://agent.example/"}, "agents.relay.url", "http:// or https://"),
        ({**GOOD, "url": "http://agent.example:99999/"}, "agents.relay.url", "port from 1"),
        ({**GOOD, "url": "http://agent.example:0/"}, "agents.relay.url", "port from 1"),
        ({**GOOD, "url": "http://agent.example/a b"}, "agents.relay.url", "spaces or control"),
        ({**GOOD, "url": "http://agent.example/\r\nX: y"}, "agents.relay.url", "control"),
        ({"url": GOOD["url"]}, "agents.relay.secret", "required field is missing"),
        ({**GOOD, "secret": "too-short-15chr"}, "agents.relay.secret", "at least 16 characters"),
        ({**GOOD, "secret": ""}, "agents.relay.secret", "must not be empty"),
        ({**GOOD, "timeout": float("inf")}, "agents.relay.timeout", "finite"),
        ({**GOOD, "timeout": 1e308}, "agents.relay.timeout", "at most 366 days"),
        ({**GOOD, "timeout": 0}, "agents.relay.timeout", "greater than 0"),
        ({**GOOD, "timeout": "9" * 5_000}, "agents.relay.timeout", "finite"),
        ({**GOOD, "max_attempts": float("inf")}, "agents.relay.max_attempts", "finite"),
        ({**GOOD, "max_attempts": 1e308}, "agents.relay.max_attempts", "integer"),
        ({**GOOD, "max_attempts": 0}, "agents.relay.max_attempts", "greater than or equal to 1"),
        ({**GOOD, "max_attempts": 11}, "agents.relay.max_attempts", "less than or equal to 10"),
        ({**GOOD, "max_attempts": "9" * 5_000}, "agents.relay.max_attempts", "integer"),
        ({**GOOD, "max_attempts": "３"}, "agents.relay.max_attempts", "integer"),
        ({**GOOD, "retries": 3}, "agents.relay.retries", "unknown field"),
    ],
)
def test_issue11_bad_http_agent_config_names_the_field(
    fields: dict[str, object], path: str, reason: str
) -> None:
    text = yaml.safe_dump({"agents": {"relay": {"kind": "http", **fields}}})
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert SECRET not in str(caught.value)


def test_issue11_check_config_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        "agents: {relay: {kind: http, url: https://agent.example/, secret: tiny-s3cr3t}}\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: agents.relay.secret: must be at least 16 characters")
    assert "tiny-s3cr3t" not in err
    path.write_text(
        f"agents: {{relay: {{kind: http, url: https://agent.example/, secret: {SECRET}}}}}\n"
    )
    assert main(["check-config", str(path)]) == 0
    assert "1 agent," in capsys.readouterr().out


def test_issue11_defaults_and_the_secret_stays_secret() -> None:
    config = HttpAgentConfig.model_validate({"kind": "http", **GOOD})
    assert (config.timeout, config.max_attempts) == (30.0, 3)
    assert SECRET not in repr(config)


async def test_issue11_factory_builds_the_http_agent() -> None:
    agent = build_agent("relay", HttpAgentConfig.model_validate({"kind": "http", **GOOD}))
    assert isinstance(agent, HttpAgent)
    await agent.aclose()
