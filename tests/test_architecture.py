"""The layout holds: no import circle between modules, the import contracts kept, a small top.

The layering itself is written once, as the import-linter contracts in pyproject.toml
(this module runs `lint-imports` on them). It adds what a contract cannot say: no two
modules need each other, directly or round a longer circle, counting the imports made
only for type checking (a type-only circle is still two modules that each need the
other), and `gateway/` keeps at most twelve modules and packages at its top.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "guards", "connectors", "loopwarden_integrations", "integrations")
MAX_GATEWAY_TOP = 12


def _graph() -> Mapping[str, set[str]]:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    return {
        module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules
    }


def _circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_issue21_no_two_modules_import_each_other_even_for_types_only() -> None:
    assert _circles(_graph()) == []


def test_issue21_the_circle_check_sees_a_type_only_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c"]]


def test_issue21_the_import_contracts_are_kept() -> None:
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_issue21_gateway_keeps_at_most_twelve_modules_and_packages_at_its_top() -> None:
    top = [
        path.name
        for path in (ROOT / "gateway").iterdir()
        if (path.suffix == ".py" and path.stem not in {"__init__", "__main__"})
        or (path.is_dir() and (path / "__init__.py").is_file())
    ]
    assert len(top) <= MAX_GATEWAY_TOP, sorted(top)
