"""Metrics over OTLP (issue 25): a real OTLP/HTTP receiver gets what /metrics shows.

The proxy in front of the fake LLM provider, and the Gateway runtime with an `openai`
agent on the fake platform, each with `setup_telemetry` pointed at the receiver in
`tests/fakes/otlp_receiver.py`. Every export is forced with `Telemetry.force_flush` (in a
thread: the exporter's HTTP post is answered by this event loop), never waited for; and
`loopwarden proxy` as a process, whose last export comes when it stops.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.app.errors import ConfigError
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.cli.main import main
from gateway.config import TelemetryConfig, parse_config
from gateway.observability import semconv, tracing
from gateway.observability.metrics import Metrics
from gateway.observability.otel_metrics import RegistryBridge
from gateway.observability.telemetry import ExportedMetrics, Telemetry, setup_telemetry
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM, tool_call_response
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedPoint
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, proxy_yaml, running_proxy
from tests.gateway.proxy.test_proxy_cli import free_port
from tests.gateway.proxy.test_proxy_metrics import chat, scrape, value
from tests.gateway.runtime_helpers import FakePlatform

LIMITED = """
call_loop: {max_repeats: 2, window_seconds: 60, pause_seconds: 60}
budgets:
  - {name: agent-daily, per: [agent], limit_usd: 0.5, period: day}
"""
TOOL = "tests.gateway.agents.tools_for_tests:get_status"


@asynccontextmanager
async def exporting(
    receiver: OtlpReceiver, metrics: ExportedMetrics, service: str
) -> AsyncIterator[Telemetry]:
    """Traces and metrics of `metrics` exported to `receiver` until the block ends."""
    telemetry = setup_telemetry(TelemetryConfig(otlp_endpoint=receiver.endpoint), service, metrics)
    try:
        yield telemetry
    finally:
        await asyncio.to_thread(telemetry.shutdown)


async def flushed(telemetry: Telemetry) -> None:
    """Every metric exported and received now."""
    assert await asyncio.to_thread(telemetry.force_flush)


def genai(provider: str, model: str, **more: str) -> dict[str, object]:
    """A chat call's GenAI attributes, and `more` (dotted names passed as a dict)."""
    return {
        semconv.OPERATION_NAME: semconv.CHAT,
        semconv.PROVIDER_NAME: provider,
        semconv.REQUEST_MODEL: model,
        **more,
    }


def one(points: list[ReceivedPoint], **wanted: object) -> ReceivedPoint:
    """The one point whose attributes are exactly `wanted` (dotted names passed as a dict)."""
    [point] = [point for point in points if point.attributes == wanted]
    return point


async def test_issue25_a_proxied_call_exports_genai_histograms_and_the_proxy_counters() -> None:
    async with (
        OtlpReceiver() as receiver,
        running_proxy(LIMITED) as rig,
        exporting(receiver, rig.proxy.metrics, "loopwarden-proxy-test") as telemetry,
    ):
        rig.upstream.fail_next(503)
        statuses = [await chat(rig, "another")]
        statuses += [await chat(rig, "same") for _ in range(3)]
        samples = await scrape(rig)  # also reads the budget gauges from the call store
        await flushed(telemetry)
    assert statuses == [503, 200, 200, 429]
    assert set(receiver.content_types) == {"application/x-protobuf"}

    tokens = receiver.latest(semconv.TOKEN_USAGE)
    assert {(p.kind, p.unit, p.service, p.schema_url) for p in tokens} == {
        ("histogram", "{token}", "loopwarden-proxy-test", semconv.SCHEMA_URL)
    }
    used = one(tokens, **genai("openai", MODEL, **{semconv.TOKEN_TYPE: "input"}))
    assert (used.count, used.value) == (2, 2 * INPUT_TOKENS)
    assert used.bounds == tuple(float(b) for b in semconv.TOKEN_BUCKETS)
    output = one(tokens, **genai("openai", MODEL, **{semconv.TOKEN_TYPE: "output"}))
    assert (output.count, output.value) == (2, 2 * OUTPUT_TOKENS)

    durations = receiver.latest(semconv.OPERATION_DURATION)
    assert {p.unit for p in durations} == {"s"}
    assert one(durations, **genai("openai", MODEL)).count == 2
    failed = one(durations, **genai("openai", MODEL, **{semconv.ERROR_TYPE: "503"}))
    assert failed.count == 1
    assert failed.bounds == semconv.DURATION_BUCKETS

    # The proxy's own families, bridged: the values /metrics shows, under the family name.
    refused = one(receiver.latest("proxy_refusals"), provider="openai", code="loop_detected")
    assert (refused.kind, refused.monotonic, refused.value) == ("sum", True, 1)
    assert refused.value == value(
        samples, "proxy_refusals_total", provider="openai", code="loop_detected"
    )
    saved = one(receiver.latest("spend_avoided_usd"), guard="call_loop")
    assert saved.value == value(samples, "spend_avoided_usd_total", guard="call_loop") > 0
    spend = one(
        receiver.latest("budget_spend_usd"), budget="agent-daily", group="agent=billing-bot"
    )
    assert spend.kind == "gauge"
    assert spend.value == value(samples, "budget_spend_usd", budget="agent-daily") > 0
    # A Prometheus histogram goes as its count and sum.
    added = one(receiver.latest("proxy_added_seconds_count"), provider="openai")
    assert added.value == value(samples, "proxy_added_seconds_count", provider="openai") == 3
    assert receiver.latest("proxy_added_seconds_sum")
    # The GenAI histograms are not bridged a second time.
    assert not receiver.latest("gen_ai_client_token_usage_count")


def said(text: str) -> InboundMessage:
    """A person's message to the bot in the lobby."""
    return InboundMessage(
        platform="room",
        bot_id="alpha",
        channel_id="lobby",
        thread_id=None,
        message_id=f"m-{text}",
        sender_id="u-human",
        sender_name="u-human",
        sender_is_bot=False,
        text=text,
        mentions_bot=True,
        bot_user_id="alpha",
    )


async def test_issue25_a_gateway_run_exports_genai_histograms_and_the_loops_it_cut() -> None:
    async with FakeLLM() as llm, OtlpReceiver() as receiver:
        # The model asks for the same tool call forever: the call guard cuts the turn.
        llm.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
        config = parse_config(
            f"""
http: {{host: 127.0.0.1, port: 0}}
agents:
  helper: {{kind: openai, base_url: '{llm.base_url}', model: m, tools: ['{TOOL}'],
           max_tool_rounds: 20}}
bots: [{{id: alpha, platform: room, agent: helper}}]
pipeline: {{transcript: {{max_messages: 0}}}}
policy: {{call_loop: {{max_repeats: 2}}}}
proxy: {{prices: {{m: {{input_per_1k: 1.0, output_per_1k: 1.0}}}}}}
""",
            env={},
        )
        platform = FakePlatform()
        gateway = Gateway(config, connector_factory=platform, connect_timeout=5.0)
        async with exporting(receiver, gateway.metrics, "loopwarden-test") as telemetry:
            await gateway.start()
            try:
                await platform.made["alpha"].push(said("is the db up?"))
                await gateway.request_log.settle()
                await flushed(telemetry)
            finally:
                await gateway.stop(1.0)
    metrics = gateway.metrics
    cut = metrics.value("loops_cut_total", guard="call_loop")
    assert cut == 1
    [loops] = receiver.latest("loops_cut")
    assert (loops.kind, loops.value) == ("sum", cut)
    assert loops.attributes == {"guard": "call_loop", "room": "room:lobby"}
    assert loops.service == "loopwarden-test"
    saved = one(receiver.latest("spend_avoided_usd"), guard="call_loop")
    assert saved.value == metrics.value("spend_avoided_usd_total", guard="call_loop") > 0
    calls = len(llm.calls("/v1/chat/completions"))
    used = one(
        receiver.latest(semconv.TOKEN_USAGE),
        **genai("openai", "m", **{semconv.TOKEN_TYPE: "input"}),
    )
    assert (
        used.count
        == calls
        == metrics.value("gen_ai_client_token_usage_count", gen_ai_token_type="input")
    )
    assert used.value == metrics.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input")
    assert one(receiver.latest(semconv.OPERATION_DURATION), **genai("openai", "m")).count == calls
    decisions = receiver.latest("guard_decisions")
    assert sum(p.value for p in decisions) == metrics.value("guard_decisions_total")


def test_issue25_telemetry_off_imports_no_metrics_exporter() -> None:
    script = (
        "import sys\n"
        "import gateway.cli.main, gateway.app.runtime, gateway.proxy.app\n"
        "from gateway.config import TelemetryConfig\n"
        "from gateway.observability.metrics import Metrics\n"
        "from gateway.observability.telemetry import setup_telemetry\n"
        "telemetry = setup_telemetry(TelemetryConfig(), 'x', Metrics())\n"
        "assert telemetry.metrics is None and not telemetry.tracer.enabled\n"
        "telemetry.shutdown()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk',"
        " 'opentelemetry.exporter', 'gateway.observability.otel'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


_INTERVAL = "from 100 to 86,400,000"
_TIMEOUT = "seconds from 0.1 to 3,600"
_ABSURD = ["0", "-5", "99", "nan", "inf", "1e-300", "1e308", "9" * 5_000, "abc", "5\x1b[2J"]


@pytest.mark.parametrize(
    ("variable", "setting", "reason"),
    [
        *(
            (variable, setting, _INTERVAL)
            for variable in ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT")
            for setting in _ABSURD
        ),
        # float() reads these Arabic-Indic digits as 1200, within the bounds.
        ("OTEL_METRIC_EXPORT_INTERVAL", "\u0661\u0662\u0660\u0660", _INTERVAL),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "inf", _TIMEOUT),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "-1", _TIMEOUT),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1e308", _TIMEOUT),
    ],
)
def test_issue25_an_absurd_export_setting_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, setting: str, reason: str
) -> None:
    monkeypatch.setenv(variable, setting)
    config = TelemetryConfig(otlp_endpoint="http://127.0.0.1:9")
    with pytest.raises(ConfigError) as raised:
        setup_telemetry(config, "x", Metrics())
    assert raised.value.path == variable
    assert reason in str(raised.value)
    assert "\x1b" not in str(raised.value)
    # Nothing was started: the tracer is still the no-op one.
    assert tracing.tracer() is tracing.NO_TRACER


async def test_issue25_the_export_interval_schedules_exports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    metrics = Metrics()
    metrics.loop_cut("bot_loop", "room:C1")
    async with OtlpReceiver() as receiver, exporting(receiver, metrics, "x"):
        # The reader's thread posts on its own; no flush, however slow the machine.
        await asyncio.wait_for(receiver.metrics_posted.wait(), 60)
    [point] = receiver.latest("loops_cut")
    assert point.value == 1


class CountedCollects(Collector):
    """A gauge that counts how often the registry was collected."""

    def __init__(self) -> None:
        self.collects = 0

    def collect(self) -> Iterator[Metric]:
        self.collects += 1
        yield GaugeMetricFamily("collects", "times collected", value=self.collects)


def test_issue25_one_export_reads_the_registry_once() -> None:
    metrics = Metrics()
    counted = CountedCollects()
    metrics.registry.register(counted)
    metrics.state.observe("sqlite", "claim", 0.002)
    metrics.loop_cut("bot_loop", "room:C1")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    RegistryBridge(metrics.registry, provider.get_meter("test"))
    try:
        for export in (1, 2):
            metrics.loop_cut("bot_loop", "room:C1")
            data = reader.get_metrics_data()
            assert data is not None
            points = {
                metric.name: [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]
                for resource in data.resource_metrics
                for scope in resource.scope_metrics
                for metric in scope.metrics
                if isinstance(metric.data, Sum | Gauge)
            }
            # Registered when the bridge was built, once; then once an export.
            assert counted.collects == 1 + export
            assert points["loops_cut"] == [({"guard": "bot_loop", "room": "room:C1"}, 1 + export)]
            assert points["state_operation_seconds_count"] == [
                ({"backend": "sqlite", "op": "claim"}, 1)
            ]
            assert points["state_operation_seconds_sum"] == [
                ({"backend": "sqlite", "op": "claim"}, 0.002)
            ]
    finally:
        provider.shutdown()


async def test_issue25_loopwarden_proxy_exports_its_metrics_when_it_stops(tmp_path: Path) -> None:
    port = free_port()
    async with FakeLLM() as upstream, OtlpReceiver() as receiver:
        path = tmp_path / "loopwarden.yaml"
        telemetry = f"telemetry: {{otlp_endpoint: '{receiver.endpoint}'}}\n"
        path.write_text(proxy_yaml(upstream.url, port=port) + telemetry, encoding="utf-8")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "proxy",
            "--config",
            str(path),
            stderr=asyncio.subprocess.PIPE,
            # No scheduled export: only the last one, when the proxy stops, posts.
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "OTEL_METRIC_EXPORT_INTERVAL": "86400000",
            },
        )
        assert process.stderr is not None
        try:
            started = b""
            while b"proxy listening" not in started:
                started = await asyncio.wait_for(process.stderr.readline(), timeout=20)
            url = f"http://127.0.0.1:{port}/openai/v1"
            async with openai.AsyncOpenAI(base_url=url, api_key=PROXY_KEY) as sdk:
                for _ in range(5):
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hello"}]
                    )
                with pytest.raises(openai.RateLimitError):
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hello"}]
                    )
            assert not receiver.metric_exports
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), timeout=30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0
    [export] = receiver.metric_exports
    refusals = [point for point in export if point.name == "proxy_refusals"]
    refused = one(refusals, provider="openai", code="loop_detected")
    assert (refused.value, refused.service) == (1, "loopwarden-proxy")
    [tokens] = [
        p
        for p in export
        if p.name == semconv.TOKEN_USAGE and p.attributes[semconv.TOKEN_TYPE] == "input"
    ]
    assert tokens.count == 5


def test_issue25_loopwarden_proxy_refuses_an_absurd_export_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "0")
    path = tmp_path / "loopwarden.yaml"
    telemetry = "telemetry: {otlp_endpoint: 'http://127.0.0.1:9'}\n"
    path.write_text(proxy_yaml("http://127.0.0.1:9") + telemetry, encoding="utf-8")
    assert main(["proxy", "--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert "OTEL_METRIC_EXPORT_INTERVAL: must be a number of milliseconds" in error


async def test_issue25_over_otlp_the_budget_gauges_are_read_every_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    async with (
        OtlpReceiver() as receiver,
        running_proxy(LIMITED) as rig,
        exporting(receiver, rig.proxy.metrics, "x") as telemetry,
    ):
        fresh = asyncio.create_task(telemetry.keep_fresh(rig.proxy.refresh_budget_gauges))
        try:
            assert [await chat(rig, f"question {n}") for n in range(2)] == [200, 200]
            await rig.proxy.settle()
            # No /metrics scrape: the exports carry the spend once a refresh has read it.
            while not any(point.value > 0 for point in receiver.latest("budget_spend_usd")):
                receiver.metrics_posted.clear()
                await asyncio.wait_for(receiver.metrics_posted.wait(), 60)
        finally:
            fresh.cancel()
        samples = await scrape(rig)
    [spend] = receiver.latest("budget_spend_usd")
    assert spend.attributes == {"budget": "agent-daily", "group": "agent=billing-bot"}
    assert spend.value == value(samples, "budget_spend_usd", budget="agent-daily")
    [limit] = receiver.latest("budget_limit_usd")
    assert limit.value == 0.5


async def test_issue25_otel_service_name_wins_for_traces_and_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-gateway")
    metrics = Metrics()
    metrics.loop_cut("bot_loop", "room:C1")
    async with OtlpReceiver() as receiver, exporting(receiver, metrics, "loopwarden") as telemetry:
        with telemetry.tracer.span("message room", {}, root=True):
            pass
        await flushed(telemetry)
    [point] = receiver.latest("loops_cut")
    [span] = receiver.spans
    assert (point.service, span.service) == ("billing-gateway", "billing-gateway")
