"""MkDocs build hooks: the reference pages written once, from the code (mkdocs.yml `hooks`).

- reference/config.md and reference/cli.md are generated whole on every build from the
  pydantic models and the argparse parser (scripts/gen_reference.py); they are not in
  the tree, so they can never be stale.
- A page may hold a marker line that the build replaces with a generated table:
  `<!-- generated: metrics -->` (the series of the metrics registry) and
  `<!-- generated: openapi -->` (the operations of docs/reference/openapi.yaml, which a
  test holds to the routes the gateway and the proxy serve).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts import gen_reference  # noqa: E402  (the repository root is on the path first)

OPENAPI_PATH = ROOT / "docs" / "reference" / "openapi.yaml"
_METHODS = ("get", "post", "put", "patch", "delete")


def openapi_markdown() -> str:
    """A table of every operation in openapi.yaml: method, path, who serves it, summary."""
    document: dict[str, Any] = yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))
    rows = ["| Method | Path | Served by | What it does |", "|---|---|---|---|"]
    for path, item in document["paths"].items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            served = ", ".join(operation.get("x-served-by", []))
            summary = str(operation.get("summary", "")).replace("|", "\\|")
            rows.append(f"| {method.upper()} | `{path}` | {served} | {summary} |")
    return "\n".join(rows) + "\n"


_GENERATED_PAGES: dict[str, Callable[[], str]] = {
    "reference/config.md": gen_reference.config_markdown,
    "reference/cli.md": gen_reference.cli_markdown,
}
_MARKERS: dict[str, Callable[[], str]] = {
    "<!-- generated: metrics -->": gen_reference.metrics_markdown,
    "<!-- generated: proxy-metrics -->": gen_reference.proxy_metrics_markdown,
    "<!-- generated: openapi -->": openapi_markdown,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages to the site."""
    for uri, generate in _GENERATED_PAGES.items():
        files.append(File.generated(config, uri, content=generate()))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace each marker line with its generated table."""
    for marker, generate in _MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
