"""Reading a YAML file of config keys, safely: a mapping, UTF-8, no key set twice, bounded aliases
(and any UTF-8 text file: :func:`read_utf8`).

``yaml.safe_load`` constructs no objects, but it keeps the last of two equal keys without a
word and expands nested anchors without bound (400 bytes of "billion laughs" become
billions of nodes, which then hang the config merge). :func:`read_yaml` refuses both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlzoo.core.errors import ConfigError

YAML_MAX_NODES = 100_000
"""The most YAML nodes a config file may expand to, aliases counted at every use (``default.yaml``
has a few hundred; nested anchors of 400 bytes expand to billions, which would hang the merge)."""


class _YamlRefused(Exception):
    """A YAML file that parses but that a config may not be (a key set twice, too many nodes)."""


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key set twice in one mapping and an alias expansion
    beyond :data:`YAML_MAX_NODES` nodes."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _YamlRefused(f"sets key {key!r} twice (lines {seen[key]} and {line}); "
                                       "the second would silently win: keep one")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {}, set())
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes under ``node`` with every alias expanded (memoised per node, so the walk is linear).

    :raises _YamlRefused: beyond :data:`YAML_MAX_NODES`, or an alias that contains itself.
    """
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise _YamlRefused("holds an anchor that contains its own alias (a recursive structure)")
    open_nodes.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    if size > YAML_MAX_NODES:
        raise _YamlRefused(f"expands to more than {YAML_MAX_NODES:,} nodes through its anchors and aliases "
                           f"(line {node.start_mark.line + 1}); a config file is a few hundred")
    sizes[id(node)] = size
    return size


def read_utf8(path: Path, what: str, expected: str) -> str:
    """The text of ``path``, which must be UTF-8 (a config file, a JSONL data file).

    :param what: how the message names the file (``--config file``, ``task file``).
    :param expected: what to pass instead, ending the message.
    :raises ConfigError: a byte that is not UTF-8, naming its line and byte offset.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{what} {str(path)!r} is not a UTF-8 text file (line {line}: byte {exc.start} is "
                          f"0x{data[exc.start]:02x}): {expected}") from exc


def _one_line(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (the parser's own message spans several,
    with a caret under the column)."""
    problem = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join((problem or str(exc)).split()) + where


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML file of config keys as a dict (``{}`` for an empty file).

    :raises ConfigError: a missing or non-UTF-8 file, invalid YAML, a key set twice in one mapping,
        aliases that expand beyond :data:`YAML_MAX_NODES` nodes, or something other than a mapping
        (``what`` names it).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist or is not a file")
    text = read_utf8(path, what, "pass a YAML file of config keys")
    try:
        data = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader)
    except _YamlRefused as exc:
        raise ConfigError(f"{what} {str(path)!r} {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid YAML: {_one_line(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {str(path)!r} must hold a mapping of config keys, got {type(data).__name__}"
        )
    return data
