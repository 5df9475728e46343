"""The documentation site's generated parts held to the code (issue 22).

- loopwarden.schema.json is exactly what the config models produce now, and it accepts
  the configs the repository ships while refusing a misspelt key;
- docs/reference/openapi.yaml lists exactly the (method, path) pairs the gateway's and the
  proxy's aiohttp apps serve under /admin, /healthz, /readyz and /metrics, each under
  the server(s) that really serve it;
- the generated config and CLI pages name every field and every subcommand;
- the README is a front page: at most 250 lines, no stale claims, links that resolve.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from gateway.app.runtime import Gateway
from gateway.cli.main import build_parser
from gateway.config import Config, ProxyConfig, parse_config
from gateway.proxy.app import ProxyServer
from scripts import gen_reference

ROOT = Path(__file__).resolve().parent.parent
OPENAPI = ROOT / "docs" / "reference" / "openapi.yaml"
README = ROOT / "README.md"
ADMIN_TOKEN = "a-test-admin-token-0123456789"
_SERVED_PREFIXES = ("/admin/",)
_SERVED_PATHS = ("/healthz", "/readyz", "/metrics")


def _documented(path: str) -> bool:
    return path in _SERVED_PATHS or path.startswith(_SERVED_PREFIXES)


def _served(app_routes: Any) -> set[tuple[str, str]]:
    """(method, path) of every route an app serves that the admin API document covers."""
    served = set()
    for route in app_routes:
        if route.resource is None or route.method == "HEAD":
            continue
        path = route.resource.canonical
        if _documented(path):
            served.add((route.method, path))
    return served


def _openapi_operations(server: str) -> set[tuple[str, str]]:
    document = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    operations = set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if server in operation.get("x-served-by", ()):
                operations.add((method.upper(), path))
    return operations


def test_issue22_the_checked_in_schema_is_what_the_models_produce() -> None:
    checked_in = (ROOT / "loopwarden.schema.json").read_text(encoding="utf-8")
    assert checked_in == gen_reference.schema_text(), "run `make schema`"
    assert gen_reference.main(["check"]) == 0


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "loopwarden.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", ["deploy/loopwarden.yaml", "connectors/room/demo.yaml"])
def test_issue22_the_schema_accepts_the_shipped_configs_as_written(path: str) -> None:
    document = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    errors = [e.message for e in _validator().iter_errors(document)]
    assert errors == []


def test_issue22_the_schema_takes_durations_as_text_and_env_references_for_numbers() -> None:
    document = {
        "http": {"port": "${PORT:-8787}"},
        "pipeline": {"transcript": {"ttl": "7d"}, "dedupe": "${DEDUPE}"},
    }
    assert [e.message for e in _validator().iter_errors(document)] == []


@pytest.mark.parametrize(
    "document",
    [
        {"polciy": {}},
        {"policy": {"bot_loop": {"max_events_per_window": "lots"}}},
        {"state": {"backend": "postgres"}},
        {"http": {"port": "8787; rm -rf /"}},
        {"pipeline": {"transcript": {"ttl": "7 weeks"}}},
    ],
)
def test_issue22_the_schema_refuses_what_check_config_refuses(document: dict[str, Any]) -> None:
    assert list(_validator().iter_errors(document)), document


def test_issue22_the_state_url_default_is_shown_not_masked() -> None:
    schema = json.loads(gen_reference.schema_text())
    state = schema["$defs"]["StateConfig"]["properties"]["url"]
    assert state["default"] == "redis://127.0.0.1:6379/0"
    assert "*****" not in gen_reference.schema_text()


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_issue22_the_config_page_names_every_field_of_the_top_models() -> None:
    page = gen_reference.config_markdown()
    rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", page, re.MULTILINE))
    missing = (_fields(Config) | _fields(ProxyConfig)) - rows
    assert missing == set()
    assert "## ProxyConfig" in page
    assert "Config path: `proxy`" in page


def test_issue22_the_cli_page_has_every_subcommand_from_the_parser() -> None:
    page = gen_reference.cli_markdown()
    parser = build_parser()
    names = [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]
    assert names
    for name in names:
        assert f"## `loopwarden {name}`" in page
    assert "--no-kickoff" in page  # the demo's own options, not its pass-through parser


def test_issue22_the_metrics_page_lists_every_registry_series() -> None:
    table = gen_reference.metrics_markdown()
    for series in ("messages_in_total", "guard_decisions_total", "state_degraded"):
        assert f"| `{series}` |" in table
    assert "`shadow`" in table


def test_issue25_the_metrics_page_lists_the_proxys_series() -> None:
    table = gen_reference.proxy_metrics_markdown()
    for series in ("proxy_calls_total", "gen_ai_client_token_usage", "budget_limit_usd"):
        assert f"| `{series}` |" in table
    assert "`gen_ai_token_type`" in table
    assert "| `loops_cut_total` | counter | `guard`, `room` |" in gen_reference.metrics_markdown()
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert "<!-- generated: proxy-metrics -->" in page


def test_issue22_openapi_lists_exactly_the_gateways_admin_routes() -> None:
    config = parse_config(f"http: {{host: 127.0.0.1, port: 0, admin_token: {ADMIN_TOKEN}}}", env={})
    served = _served(Gateway(config).app.router.routes())
    assert ("GET", "/admin/status") in served
    assert _openapi_operations("gateway") == served


def test_issue22_openapi_lists_exactly_the_proxys_admin_routes() -> None:
    config = parse_config(
        "proxy: {port: 0, keys: {lw-demo-key: {agent: a}},"
        " upstreams: {openai: {base_url: 'http://127.0.0.1:9/v1', api_key: k}}}",
        env={},
    )
    served = _served(ProxyServer(config).app.router.routes())
    assert ("POST", "/admin/spend/limit") in served
    assert _openapi_operations("proxy") == served


_STALE = (
    "about 1,350 tests",
    "None of these can be run here",
    "pip install 'loopwarden[",
)


def test_issue22_the_readme_is_a_front_page_without_stale_claims() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for claim in _STALE:
        assert claim not in text
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target


def test_issue22_no_page_names_an_unpublished_install() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        assert "pip install 'loopwarden[" not in page.read_text(encoding="utf-8"), page
