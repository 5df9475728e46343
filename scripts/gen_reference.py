"""The reference written once, from the code: config fields, JSON Schema, CLI and metrics.

- `config_schema()`: the JSON Schema of `loopwarden.yaml`, from the pydantic models
  (`Config`, whose `proxy` is `ProxyConfig`). It is checked in at the repository's root
  as `loopwarden.schema.json` for editors (completion and validation); `make schema`
  rewrites it and a test fails when it differs from the models.
- `config_markdown()`, `cli_markdown()` and `metrics_markdown()`: the pages
  docs/reference/config.md, cli.md and metrics.md. The site's build hook
  (docs/hooks.py) generates them on every `mkdocs build`, so they are never stale and
  never checked in.

Decisions where the issue is silent:
- The schema file describes what may be written, not only what validates after
  `${VAR}` interpolation: every number, integer or boolean also accepts a whole
  `${VAR}` or `${VAR:-default}` string, and a duration field (`DurationText`) also takes
  `30s`, `10m`, `2h` or `7d`, so an editor never flags a file `check-config` accepts.
- Defaults that are `SecretStr` (the Redis URL) are shown as their value: they are the
  code's defaults, not anyone's secret.
- The page lists each model once, under the first config path that reaches it, with
  links where another field uses it; bounds are those the models declare (`minimum`,
  `maximum`, lengths, patterns), the bounds every field shares (no inf/nan, durations at
  most 366 days, chosen secrets of 16 characters or more) are stated once above them.

Usage: `python -m scripts.gen_reference schema` writes loopwarden.schema.json;
`python -m scripts.gen_reference check` exits 1 when the checked-in file is stale.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, SecretStr
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gateway.calls.entry import CallLogEntry
from gateway.cli.main import build_parser
from gateway.config import Config
from gateway.config.limits import duration_text
from gateway.demo.room import DESCRIPTION as DEMO_DESCRIPTION
from gateway.demo.room import add_arguments as add_demo_arguments
from gateway.observability.metrics import (
    BudgetFigure,
    Metrics,
    ModelCallMetrics,
    StateMetrics,
    watch_pending,
)
from gateway.proxy.metrics import ProxyMetrics

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "loopwarden.schema.json"
SCHEMA_ID = "https://loopwarden.invalid/loopwarden.schema.json"
ENV_PATTERN = r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"
DURATION_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[smhdSMHD]?\s*$"
HELP_COLUMNS = "100"

Json = dict[str, Any]


class _ConfigSchema(GenerateJsonSchema):
    """Pydantic's schema with durations written as text and secret defaults readable."""

    def function_before_schema(
        self, schema: core_schema.BeforeValidatorFunctionSchema
    ) -> JsonSchemaValue:
        inner = super().function_before_schema(schema)
        if schema["function"].get("function") is duration_text:
            text = {"type": "string", "pattern": DURATION_PATTERN}
            return {"anyOf": [inner, text], "description": "seconds, or 30s, 10m, 2h, 7d"}
        return inner

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, BaseModel):
            dft = dft.model_dump()
        return super().encode_default(_reveal(dft))


def _reveal(value: Any) -> Any:
    """`value` with every `SecretStr` in it replaced by its text (the code's own defaults)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {key: _reveal(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_reveal(item) for item in value]
    return value


def model_schema() -> Json:
    """The models' own JSON Schema (validation mode), before `${VAR}` is allowed."""
    return Config.model_json_schema(schema_generator=_ConfigSchema)


def _allow_env(node: Any) -> Any:
    """`node` where every non-string scalar also accepts a whole `${VAR}` string."""
    if isinstance(node, list):
        return [_allow_env(item) for item in node]
    if not isinstance(node, dict):
        return node
    walked = {key: _allow_env(value) for key, value in node.items()}
    if walked.get("type") in ("number", "integer", "boolean"):
        return {"anyOf": [walked, {"type": "string", "pattern": ENV_PATTERN}]}
    return walked


def config_schema() -> Json:
    """The checked-in schema of loopwarden.yaml: the models' schema with `${VAR}` allowed."""
    schema = _allow_env(model_schema())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "loopwarden.yaml",
    }


def schema_text() -> str:
    """`config_schema()` as the file holds it: sorted keys, two-space indent, final newline."""
    return json.dumps(config_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# The config reference page


@dataclass(frozen=True, slots=True)
class _Section:
    """One model of the config, at the first path that reaches it."""

    name: str
    path: str
    schema: Json


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return name.lower().replace("_", "-")


def _refs(node: Any) -> Iterator[str]:
    """Every `$ref` under `node`, in document order."""
    if isinstance(node, dict):
        if "$ref" in node:
            yield _ref_name(node["$ref"])
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _sections(schema: Json) -> list[_Section]:
    """The root and every model it reaches, breadth first, each with its config path."""
    defs: Mapping[str, Json] = schema.get("$defs", {})
    sections = [_Section("Config", "(top level)", schema)]
    seen = {"Config"}
    for section in sections:
        for field, prop in section.schema.get("properties", {}).items():
            path = field if section.name == "Config" else f"{section.path}.{field}"
            for name in _refs(prop):
                if name not in seen and name in defs:
                    seen.add(name)
                    sections.append(_Section(name, path, defs[name]))
    return sections


def _type(node: Json) -> str:
    """A field's type as a reader writes it, with links to the models it names."""
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " | ".join(_type(option) for option in node[key])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        if isinstance(items, dict):
            return f"list of {_type(items)}"
        if "prefixItems" in node:
            return "[" + ", ".join(_type(i) for i in node["prefixItems"]) + "]"
        return "list"
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return f"map of {_type(values)}"
        return "map"
    if kind == "string" and node.get("format") == "password":
        return "secret string"
    if kind == "null":
        return "null"
    if kind == "string" and "pattern" in node and node["pattern"] == DURATION_PATTERN:
        return "duration text"
    return str(kind) if kind else "any"


_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("pattern", "matches `{}`"),
)


def _bounds(node: Json) -> str:
    found: list[str] = []
    options = [node, *node.get("anyOf", []), *node.get("oneOf", [])]
    for option in options:
        for key, template in _BOUNDS:
            if key in option and not (key == "pattern" and option[key] == DURATION_PATTERN):
                text = template.format(option[key])
                if text not in found:
                    found.append(text)
    return ", ".join(found)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(field: str, node: Json, required: Sequence[str]) -> str:
    if field in required:
        return "required"
    if "default" not in node or any(True for _ in _refs(node)):
        return ""
    return _cell(f"`{json.dumps(node['default'], ensure_ascii=False)}`")


def config_markdown() -> str:
    """docs/reference/config.md: every model of the config, its fields' types, defaults, bounds."""
    schema = model_schema()
    out = io.StringIO()
    out.write(
        "# Every config field\n\n"
        "Generated from the pydantic models (`gateway.config`) when the site is built, so it\n"
        "always matches the code. The file's shape and the rules every field shares (`${VAR}`\n"
        "interpolation, no inf or nan, durations at most 366 days, secrets you choose 16\n"
        "characters or more) are in [The configuration file](configuration.md). Editors can\n"
        "complete and check `loopwarden.yaml` with the JSON Schema checked in at the\n"
        "repository's root, `loopwarden.schema.json` (`make schema` regenerates it); for\n"
        "example, in VS Code with the YAML extension, put this first line in the file:\n\n"
        "```yaml\n# yaml-language-server: $schema=./loopwarden.schema.json\n```\n"
    )
    for section in _sections(schema):
        out.write(f"\n## {section.name}\n\n")
        out.write(f"Config path: `{section.path}`\n\n")
        description = section.schema.get("description")
        if description and section.name != "Config":
            out.write(description.strip() + "\n\n")
        union = section.schema.get("oneOf") or section.schema.get("anyOf")
        properties: Mapping[str, Json] = section.schema.get("properties", {})
        if not properties:
            if union:
                out.write(f"One of: {_type(section.schema)}\n")
            continue
        required = section.schema.get("required", [])
        out.write("| Field | Type | Default | Bounds |\n|---|---|---|---|\n")
        for field, prop in properties.items():
            out.write(
                f"| `{field}` | {_cell(_type(prop))} | {_default(field, prop, required)} "
                f"| {_cell(_bounds(prop))} |\n"
            )
    return out.getvalue()


# The CLI reference page


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _help(parser: argparse.ArgumentParser) -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        return parser.format_help().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def _demo_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopwarden demo", description=DEMO_DESCRIPTION)
    add_demo_arguments(parser)
    return parser


def _commands(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for sub, child in _subparsers(parser):
        full = f"{name} {sub}"
        yield from _commands(_demo_parser() if full == "loopwarden demo" else child, full)


def cli_markdown() -> str:
    """docs/reference/cli.md: each command's `--help`, from the parser `loopwarden` runs."""
    out = io.StringIO()
    out.write(
        "# Command line\n\n"
        "Generated from the `loopwarden` command's own argparse parser when the site is\n"
        "built: each section is that command's `--help`. Exit codes: 0 success, 2 an invalid\n"
        "configuration or usage (`config error: field.path: reason` on stderr), 1 a failure\n"
        "at start-up (a port in use, the state backend unreachable).\n"
    )
    for name, parser in _commands(build_parser(), "loopwarden"):
        out.write(f"\n## `{name}`\n\n```text\n{_help(parser)}\n```\n")
    return out.getvalue()


# The metrics reference page


@dataclass(frozen=True, slots=True)
class _HealthyStore:
    """A state backend reporting no outage and nothing pending, so the state gauges (and a
    call store's pending writes) are collected."""

    degraded: bool = False
    unavailable_calls: int = 0
    pending_writes: int = 0
    pending_dropped: int = 0
    replica_waits_short: int = 0


_SAMPLE_LABEL = "x"


def _count_once_each(metrics: Metrics) -> None:
    """Count one event with every counting method, so each family shows its label names."""
    metrics.message_in(_SAMPLE_LABEL)
    metrics.reply_out(_SAMPLE_LABEL)
    metrics.refusal(_SAMPLE_LABEL, _SAMPLE_LABEL)
    metrics.guard_decision(_SAMPLE_LABEL, _SAMPLE_LABEL)
    metrics.delivery_retry(_SAMPLE_LABEL)
    metrics.delivery_failure(_SAMPLE_LABEL)
    metrics.error(_SAMPLE_LABEL)
    metrics.event_dropped(_SAMPLE_LABEL, _SAMPLE_LABEL)
    metrics.transcript_skipped(1)
    metrics.loop_cut(_SAMPLE_LABEL, _SAMPLE_LABEL)
    _model_calls(metrics.model_calls, metrics.state)


def _model_calls(metrics: ModelCallMetrics | ProxyMetrics, state: StateMetrics) -> None:
    """Log a model call answered and one refused, and time a failed state call, into these."""
    for outcome in ("forwarded", "loop_detected"):
        entry = CallLogEntry(
            at=0.0,
            provider=_SAMPLE_LABEL,
            agent=_SAMPLE_LABEL,
            session="",
            circuit=_SAMPLE_LABEL,
            model=_SAMPLE_LABEL,
            outcome=outcome,
            input_tokens=1,
            output_tokens=1,
        )
        metrics.call_logged(entry)
    state.observe(_SAMPLE_LABEL, _SAMPLE_LABEL, 0.001)
    state.failed(_SAMPLE_LABEL, _SAMPLE_LABEL)


def _proxy_registry() -> CollectorRegistry:
    """The proxy's registry with every family shown."""
    metrics = ProxyMetrics([_SAMPLE_LABEL])
    metrics.watch_state(_HealthyStore())
    metrics.watch_calls(_HealthyStore())
    _model_calls(metrics, metrics.state)
    metrics.call_logged(
        CallLogEntry(
            at=0.0,
            provider=_SAMPLE_LABEL,
            agent=_SAMPLE_LABEL,
            session="",
            circuit=_SAMPLE_LABEL,
            model=_SAMPLE_LABEL,
            outcome="upstream_error",
        )
    )
    metrics.forwarded(_SAMPLE_LABEL, added=0.001, upstream=0.1)
    metrics.budget_figures([BudgetFigure(_SAMPLE_LABEL, _SAMPLE_LABEL, 1.0, 2.0)])
    return metrics.registry


def _gateway_registry() -> CollectorRegistry:
    """The gateway's registry with every family shown."""
    metrics = Metrics()
    metrics.watch_state(_HealthyStore())
    watch_pending(metrics.registry, _HealthyStore())
    _count_once_each(metrics)
    return metrics.registry


def metric_rows(proxy: bool = False) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(series name, type, label names, help) of every series a registry exports.

    The gateway's, or with `proxy` the LLM-call proxy's.
    """
    registry = _proxy_registry() if proxy else _gateway_registry()
    rows: list[tuple[str, str, tuple[str, ...], str]] = []
    for family in registry.collect():
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels)
        series = family.name + "_total" if family.type == "counter" else family.name
        rows.append((series, family.type, tuple(sorted(labels)), family.documentation))
    return rows


def proxy_metrics_markdown() -> str:
    """docs/reference/metrics.md's generated table of the proxy's series."""
    return metrics_markdown(proxy=True)


def metrics_markdown(proxy: bool = False) -> str:
    """docs/reference/metrics.md's generated table: the registry's series, types and labels."""
    out = io.StringIO()
    out.write("| Series | Type | Labels | Help |\n|---|---|---|---|\n")
    for series, kind, labels, documentation in metric_rows(proxy):
        names = ", ".join(f"`{label}`" for label in labels)
        out.write(f"| `{series}` | {kind} | {names} | {_cell(documentation)} |\n")
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    """`schema` writes loopwarden.schema.json; `check` exits 1 when it differs from the models."""
    parser = argparse.ArgumentParser(prog="python -m scripts.gen_reference")
    parser.add_argument("action", choices=("schema", "check"))
    args = parser.parse_args(argv)
    text = schema_text()
    if args.action == "schema":
        SCHEMA_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_PATH.name}")
        return 0
    current = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.exists() else ""
    if current != text:
        print(f"{SCHEMA_PATH.name} differs from the models: run `make schema`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
