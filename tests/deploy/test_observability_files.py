"""deploy/grafana and deploy/prometheus: held to the metrics the code exports.

The metric names and labels come from the gateway's own registry
(gateway/observability/metrics.py, with a Redis state store watched, as the runtime
does) and the LLM-call proxy's (gateway/proxy/metrics.py, served at its /metrics), each
shown every series by calling what counts into it, so renaming a metric or a label in
code fails here until the dashboard and the alerts follow. `promtool` checks the rules
and the scrape config, runs alerts_test.yaml, and parses every dashboard query; without
promtool those tests skip, except under CI=true.
"""

from __future__ import annotations

import inspect
import json
import os
import pkgutil
import re
import shutil
import subprocess
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.skips import Skip
from gateway.agents.spend import SPEND
from gateway.app import middlewares
from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.config import HttpConfig
from gateway.observability.metrics import BudgetFigure, Metrics, ModelCallMetrics, StateMetrics
from gateway.proxy.metrics import ANOMALY_ACTIONS, REFUSAL_CODES, UPSTREAM_ERRORS, ProxyMetrics
from gateway.state.redis import RedisStateStore

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GRAFANA = DEPLOY / "grafana"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = GRAFANA / "loopwarden.json"
ALERTS = PROMETHEUS / "alerts.yaml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yaml"
SCRAPE_CONFIG = PROMETHEUS / "prometheus.yml"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

Doc = dict[str, Any]

# Labels every scraped series gets from Prometheus, and the series Prometheus writes itself.
_TARGET_LABELS = frozenset({"job", "instance"})
_PROMETHEUS_SERIES = {"up": _TARGET_LABELS}
# The public methods of Metrics that count nothing.
_NOT_COUNTING = frozenset({"value", "render", "watch_state"})
_SAMPLE_ARGUMENT: dict[object, object] = {str: "x", int: 1}

# PromQL words that are not metric names; a name followed by "(" is a function.
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
_IDENTIFIER = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?")
_GRAFANA_RANGE = re.compile(r"\$__\w+")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


# What the code exports


def _count_once_each(metrics: Metrics) -> None:
    """Call every counting method of `metrics` once, so each counter shows its labels."""
    for name, method in inspect.getmembers(metrics, inspect.ismethod):
        if name.startswith("_") or name in _NOT_COUNTING:
            continue
        hints = typing.get_type_hints(method)
        required = [
            p.name for p in inspect.signature(method).parameters.values() if p.default is p.empty
        ]
        unknown = [p for p in required if hints[p] not in _SAMPLE_ARGUMENT]
        assert not unknown, f"Metrics.{name}: no sample argument for {unknown}"
        method(*(_SAMPLE_ARGUMENT[hints[p]] for p in required))


def _entry(outcome: CallOutcome, status: int | None = 200) -> CallLogEntry:
    """A request-log entry of one model call with this outcome."""
    return CallLogEntry(
        at=0.0,
        provider="openai",
        agent="a",
        session="",
        circuit="a",
        model="m",
        outcome=outcome,
        status=status,
        input_tokens=3,
        output_tokens=4,
        cost=0.01,
        duration_ms=5.0,
    )


def _model_calls(metrics: ModelCallMetrics | ProxyMetrics, state: StateMetrics) -> None:
    """Log a sent, a failed and a refused model call, and time a state call, into these."""
    for entry in (_entry("forwarded"), _entry("upstream_error", 502), _entry("loop_detected")):
        metrics.call_logged(entry)
    state.observe("redis", "claim", 0.001)
    state.failed("redis", "claim")


def gateway_registry() -> Metrics:
    """The gateway's metrics, with every family shown."""
    metrics = Metrics()
    metrics.watch_state(RedisStateStore("redis://127.0.0.1:1/0"))
    _count_once_each(metrics)
    _model_calls(metrics.model_calls, metrics.state)
    return metrics


def proxy_registry() -> ProxyMetrics:
    """The proxy's metrics, with every family shown."""
    metrics = ProxyMetrics(["openai"])
    metrics.watch_state(RedisStateStore("redis://127.0.0.1:1/0"))
    _model_calls(metrics, metrics.state)
    metrics.forwarded("openai", added=0.001, upstream=0.5)
    metrics.anomaly(paused=False)
    metrics.budget_figures([BudgetFigure("b", "all", 1.0, 10.0)])
    return metrics


def exported() -> dict[str, frozenset[str]]:
    """Each series name the gateway's and the proxy's /metrics can show, with its labels."""
    series: dict[str, frozenset[str]] = {}
    families = [*gateway_registry().registry.collect(), *proxy_registry().registry.collect()]
    for family in families:
        assert family.samples, f"{family.name}: nothing that counts into it shows it"
        for sample in family.samples:
            series[sample.name] = series.get(sample.name, frozenset()) | set(sample.labels)
    return series


def scraped() -> dict[str, frozenset[str]]:
    """The series Prometheus holds for a gateway: its own, plus the target labels and `up`."""
    return {
        **{name: labels | _TARGET_LABELS for name, labels in exported().items()},
        **_PROMETHEUS_SERIES,
    }


def stage_names() -> set[str]:
    """Every pipeline stage's name (refusals_total and errors_total's `stage`), and spend's."""
    names = {SPEND}
    for info in pkgutil.iter_modules(middlewares.__path__):
        module = import_module(f"{middlewares.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and isinstance(vars(value).get("name"), str):
                names.add(vars(value)["name"])
    return names


def scrape_jobs() -> set[str]:
    """The job names prometheus.yml scrapes."""
    return {job["job_name"] for job in load_yaml(SCRAPE_CONFIG)["scrape_configs"]}


def label_values() -> dict[tuple[str, str], set[str]]:
    """The values the code gives to a label, where it has a fixed vocabulary."""
    stages = stage_names()
    jobs = scrape_jobs()
    vocabularies = {
        ("refusals_total", "stage"): stages,
        ("errors_total", "stage"): stages,
        ("events_dropped_total", "reason"): {skip.value for skip in Skip},
        ("guard_decisions_total", "shadow"): {"true", "false"},
        ("loops_cut_total", "guard"): {"bot_loop", "tool_loop", "call_loop"},
        ("spend_avoided_usd_total", "guard"): {"call_loop", "spend"},
        ("proxy_refusals_total", "code"): set(REFUSAL_CODES),
        ("proxy_upstream_errors_total", "reason"): set(UPSTREAM_ERRORS),
        ("spend_anomalies_total", "action"): set(ANOMALY_ACTIONS),
    }
    for name in scraped():
        vocabularies[(name, "job")] = jobs
    return vocabularies


# PromQL, read far enough to name its series and labels


@dataclass(frozen=True)
class Matcher:
    """One label matcher of a selector."""

    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Query:
    """What one PromQL expression reads: its series, their matchers, its grouping labels."""

    where: str
    names: frozenset[str]
    matchers: tuple[tuple[str, Matcher], ...]
    grouping: frozenset[str]


def read_query(where: str, expr: str) -> Query:
    """The series names, matchers and grouping labels of `expr` (Grafana variables allowed)."""
    text = _GRAFANA_RANGE.sub("5m", expr)
    matchers: list[tuple[str, Matcher]] = []
    for selector in _SELECTOR.finditer(text):
        name = selector.group(1) or ""
        assert name, f"{where}: a selector without a metric name: {selector.group(0)}"
        matchers.extend((name, Matcher(*m.groups())) for m in _MATCHER.finditer(selector.group(2)))
    grouping = {
        label.strip() for group in _GROUPING.finditer(text) for label in group.group(1).split(",")
    }
    bare = _GROUPING.sub(" ", _SELECTOR.sub(r"\1", _STRING.sub('""', text)))
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    names = {
        m.group(1)
        for m in _IDENTIFIER.finditer(bare)
        if m.group(2) is None and m.group(1) not in _KEYWORDS
    }
    assert names, f"{where}: reads no series: {expr}"
    return Query(where, frozenset(names), tuple(matchers), frozenset(grouping - {""}))


def dashboard() -> Doc:
    """deploy/grafana/loopwarden.json, parsed."""
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def panels(board: Doc) -> Iterator[Doc]:
    """Every panel of the dashboard, rows and the panels of collapsed rows included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def graph_panels(board: Doc) -> Iterator[Doc]:
    """The panels that draw queries (every panel but the rows)."""
    return (panel for panel in panels(board) if panel["type"] != "row")


def dashboard_queries() -> Iterator[tuple[Query, str]]:
    """(query, legend) for every target of every panel and every query variable."""
    for panel in graph_panels(dashboard()):
        for target in panel["targets"]:
            where = f"panel {panel['id']} ({panel['title']}) target {target['refId']}"
            yield read_query(where, target["expr"]), target.get("legendFormat", "")
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            found = _LABEL_VALUES.match(variable["query"]["query"])
            assert found, f"variable {variable['name']}: not a label_values(series, label) query"
            query = read_query(f"variable {variable['name']}", found.group(1))
            yield Query(query.where, query.names, query.matchers, frozenset({found.group(2)})), ""


def alert_rules() -> list[Doc]:
    """Every rule of alerts.yaml."""
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def alert_queries() -> Iterator[Query]:
    """The query of every alert rule."""
    for rule in alert_rules():
        yield read_query(f"alert {rule['alert']}", rule["expr"])


def all_queries() -> list[Query]:
    """Every query of the dashboard and of the alerts."""
    return [query for query, _ in dashboard_queries()] + list(alert_queries())


def load_yaml(path: Path) -> Doc:
    """One YAML file, parsed into a mapping."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), path
    return loaded


# (a) The dashboard and the alerts read only what the code exports


def test_issue25_the_registry_is_what_the_code_exports() -> None:
    series = exported()
    assert series["refusals_total"] == {"stage", "reason"}
    assert series["guard_decisions_total"] == {"guard", "code", "shadow"}
    assert series["state_degraded"] == frozenset()


def test_issue25_the_query_reader_finds_series_matchers_and_grouping() -> None:
    query = read_query(
        "example",
        'sum by (job, platform) (rate(delivery_failures_total{job=~"$job"}[$__rate_interval]))'
        " / (sum by (job, platform) (rate(replies_out_total[5m]))"
        " or 0 * max by (instance) (state_degraded)) > 0.05",
    )
    assert query.names == {"delivery_failures_total", "replies_out_total", "state_degraded"}
    assert query.matchers == (("delivery_failures_total", Matcher("job", "=~", "$job")),)
    assert query.grouping == {"job", "platform", "instance"}


def test_issue25_every_series_the_dashboard_and_alerts_read_is_exported() -> None:
    known = scraped()
    for query in all_queries():
        assert query.names <= set(known), (query.where, sorted(query.names - set(known)))


def test_issue25_every_label_they_match_or_group_by_is_on_its_series() -> None:
    known = scraped()
    for query in all_queries():
        for name, matcher in query.matchers:
            assert matcher.label in known[name], (query.where, name, matcher.label)
        for name in query.names:
            assert query.grouping <= known[name], (query.where, name, query.grouping - known[name])


def test_issue25_every_label_value_they_match_is_one_the_code_gives() -> None:
    vocabularies = label_values()
    for query in all_queries():
        for name, matcher in query.matchers:
            vocabulary = vocabularies.get((name, matcher.label))
            if vocabulary is None or "$" in matcher.value:
                continue
            values = matcher.value.split("|") if matcher.op in ("=~", "!~") else [matcher.value]
            assert set(values) <= vocabulary, (query.where, name, matcher.label, values)


def test_issue25_every_legend_label_is_on_the_panels_series() -> None:
    known = scraped()
    for query, legend in dashboard_queries():
        for label in _LEGEND_LABEL.findall(legend):
            assert label in query.grouping, (query.where, label)
            assert all(label in known[name] for name in query.names), (query.where, label)


# (b) promtool


def promtool() -> str:
    """The promtool binary; skips without it, but fails under CI (which installs it)."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: scripts/system-deps.sh installs it")
        pytest.skip("promtool is not installed (scripts/system-deps.sh installs it)")
    return found


def run_promtool(*args: str) -> str:
    """Run promtool; its output, or the test fails with it."""
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_issue25_promtool_checks_the_alert_rules() -> None:
    output = run_promtool("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in output


def test_issue25_promtool_unit_tests_fire_and_quiet_every_alert() -> None:
    run_promtool("test", "rules", str(ALERTS_TEST))
    tested = {
        case["alertname"]
        for test in load_yaml(ALERTS_TEST)["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert tested == {rule["alert"] for rule in alert_rules()}


def test_issue25_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in load_yaml(ALERTS_TEST)["tests"]:
        for case in test.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert fired == names
    assert quiet == names


def test_issue25_promtool_checks_the_scrape_config() -> None:
    run_promtool("check", "config", str(SCRAPE_CONFIG))


def test_issue25_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:panel_{panel['id']}:{target['refId']}", "expr": target["expr"]}
        for panel in graph_panels(dashboard())
        for target in panel["targets"]
    ]
    for rule in rules:
        rule["expr"] = _GRAFANA_RANGE.sub("5m", rule["expr"])
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = run_promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in output


# Each alert says how bad and what happened


def test_issue25_every_alert_waits_has_a_severity_and_explains_itself() -> None:
    for rule in alert_rules():
        if rule["labels"]["severity"] != "info":
            assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


# (c) The dashboard


def test_issue25_the_dashboard_panels_have_unique_ids_a_datasource_and_queries() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), ids
    for panel in graph_panels(board):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
            assert target["expr"].strip(), (panel["title"], target["refId"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_issue25_the_dashboard_picks_its_prometheus_by_variable() -> None:
    board = dashboard()
    [variable] = [v for v in board["templating"]["list"] if v["name"] == "DS_PROMETHEUS"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for other in board["templating"]["list"]:
        if other["type"] == "query":
            assert other["datasource"] == DATASOURCE, other["name"]
    assert board["uid"] == "loopwarden"


def test_issue25_the_dashboard_has_the_operators_rows() -> None:
    rows = [panel["title"] for panel in dashboard()["panels"] if panel["type"] == "row"]
    assert rows == [
        "Traffic",
        "Rooms and pairs cut",
        "Delivery",
        "Connectors",
        "Errors",
        "State backend",
        "Proxy",
        "Spend",
    ]


# (d) The compose file mounts exactly these files, where the configs look for them


def compose_services() -> Doc:
    """The services of deploy/compose.yaml."""
    services = load_yaml(DEPLOY / "compose.yaml")["services"]
    assert isinstance(services, dict)
    return services


def bind_mounts(service: Doc) -> dict[Path, str]:
    """A service's bind mounts: the host file (resolved) and where it appears inside."""
    mounts: dict[Path, str] = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        if source.startswith("."):
            assert mode == ["ro"], volume
            mounts[(DEPLOY / source).resolve()] = target
    return mounts


def test_issue25_compose_mounts_exactly_the_dashboard_alert_and_scrape_files() -> None:
    services = compose_services()
    mounted = {**bind_mounts(services["prometheus"]), **bind_mounts(services["grafana"])}
    shipped = {
        path.resolve()
        for folder in (GRAFANA, PROMETHEUS)
        for path in folder.rglob("*")
        if path.is_file() and path != ALERTS_TEST
    }
    assert set(mounted) == shipped


def test_issue25_prometheus_reads_its_mounted_config_and_scrapes_every_gateway() -> None:
    services = compose_services()
    prometheus = services["prometheus"]
    mounts = bind_mounts(prometheus)
    config_target = mounts[SCRAPE_CONFIG.resolve()]
    assert f"--config.file={config_target}" in prometheus["command"]
    config = load_yaml(SCRAPE_CONFIG)
    for rule_file in config["rule_files"]:
        inside = Path(config_target).parent / rule_file
        assert str(inside) in mounts.values(), rule_file
    assert str(Path(config_target).parent / ALERTS.name) == mounts[ALERTS.resolve()]
    gateways = sorted(name for name, s in services.items() if "build" in s)
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    [static] = job["static_configs"]
    assert static["targets"] == [f"{name}:{HttpConfig().port}" for name in gateways]
    assert [rule["expr"] for rule in alert_rules() if rule["alert"] == "LoopwardenGatewayDown"] == [
        f'up{{job="{job["job_name"]}"}} == 0'
    ]


def test_issue25_grafana_provisions_the_compose_prometheus_and_the_mounted_dashboard() -> None:
    services = compose_services()
    mounts = bind_mounts(services["grafana"])
    provisioning = GRAFANA / "provisioning"
    datasources = provisioning / "datasources.yaml"
    dashboards = provisioning / "dashboards.yaml"
    assert mounts[datasources.resolve()].startswith("/etc/grafana/provisioning/datasources/")
    assert mounts[dashboards.resolve()].startswith("/etc/grafana/provisioning/dashboards/")
    [source] = load_yaml(datasources)["datasources"]
    assert source["type"] == "prometheus"
    assert source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"][0]
    [provider] = load_yaml(dashboards)["providers"]
    assert Path(mounts[DASHBOARD.resolve()]).parent == Path(provider["options"]["path"])
