"""Parse YAML from outside (the config file, a `/loop set` value) within bounds.

`load_yaml(text)` is `yaml.safe_load` that refuses, with `YamlLimitError` saying why and
where, what would otherwise crash or stall whoever reads the value next: nesting deeper
than `MAX_DEPTH` (PyYAML's composer recurses, so 10,000 `[` is a RecursionError), a
document whose aliases expand to more than `max_nodes` values (a "billion laughs" is a
few lines of text but a tree that every later walk visits in full), an alias to the node
that contains it (a cycle), and an integer longer than Python converts. A plain YAML
syntax error is still `yaml.YAMLError`.
"""

from __future__ import annotations

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import MAX_DEPTH

MAX_NODES = 100_000


class YamlLimitError(LoopwardenError, ValueError):
    """A YAML document is beyond the parser's bounds; the message says which and where."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts nesting and the size of the tree the aliases expand to."""

    def __init__(self, text: str, *, max_depth: int, max_nodes: int) -> None:
        super().__init__(text)
        self._max_depth = max_depth
        self._max_nodes = max_nodes
        self._depth = 0
        # Expanded size of each finished node, by id: nodes live as long as the loader.
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        """Compose one node, refusing it when too deep, cyclic or too large once expanded."""
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # stub lacks types
        line = _line(event.start_mark)
        if self._depth >= self._max_depth:
            raise YamlLimitError(f"nested deeper than {self._max_depth} levels (line {line})")
        alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None or id(node) in self._sizes:
            return node
        if alias:
            raise YamlLimitError(f"an alias refers to the node that contains it (line {line})")
        size = 1 + sum(self._sizes[id(child)] for child in _children(node))
        if size > self._max_nodes:
            raise YamlLimitError(
                f"aliases expand it to more than {self._max_nodes} values (line {line})"
            )
        self._sizes[id(node)] = size
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer, or YamlLimitError when it has more digits than Python converts."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            line = _line(node.start_mark)
            raise YamlLimitError(f"a number has too many digits (line {line})") from None


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _line(mark: object) -> int:
    """The 1-based line of a PyYAML mark (pure-Python or libyaml's), 0 when there is none."""
    line = getattr(mark, "line", None)
    return line + 1 if isinstance(line, int) else 0


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> object:
    """The value of one YAML document; `YamlLimitError` or `yaml.YAMLError` when refused."""
    loader = _BoundedLoader(text, max_depth=max_depth, max_nodes=max_nodes)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
