"""YAML as a config file may be: a SafeLoader that refuses duplicate keys, non-string keys and alias
expansion past a bound (a "billion laughs" file is refused at once), with errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lcfed.errors import ConfigError, require

#: nodes that aliases may add to a YAML document: PyYAML shares an aliased value, but copying or printing
#: it expands every alias, so a few lines of nested aliases ("billion laughs") become billions of nodes
MAX_ALIAS_NODES = 10_000


class _Refused(yaml.constructor.ConstructorError):
    """Valid YAML that :class:`_StrictLoader` refuses (duplicate keys, aliases), as opposed to bad syntax."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a second ``train:`` would silently replace the first),
    self-referencing anchors (which expand forever) and aliases expanding past :data:`MAX_ALIAS_NODES`."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}  # id(node) -> its nodes with every alias in it expanded
        self._alias_nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _Refused(None, None, f"alias *{event.anchor} refers to the anchor that contains it (recursive)",
                               event.start_mark)
            node = super().compose_node(parent, index)
            self._alias_nodes += self._sizes[id(node)]
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise _Refused(None, None, f"aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?): "
                               "write the values out", event.start_mark)
            return node
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open_anchors.discard(anchor)
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in children)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise _Refused(None, None, f"a key must be a plain value, not {type(key).__name__}",
                               key_node.start_mark) from None
            if first is not None:
                raise _Refused(None, None, f"duplicate key {key!r} (first at line {first}): give each key once",
                               key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``line 3, column 1: duplicate key 'train' ...`` from a PyYAML error (one line)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}{f' ({context})' if context else ''}".split())


def read_yaml(path: str | Path, flag: str, what: str = "YAML file") -> Any:
    """Parse a YAML file strictly; any problem is a :class:`ConfigError` naming ``flag`` and saying which.

    Refused: a missing or non-regular file, non-UTF-8 bytes, syntax errors, duplicate keys (also
    duplicated sections), recursive anchors, aliases expanding past :data:`MAX_ALIAS_NODES` nodes, and an
    empty document.
    """
    p = Path(path).expanduser()
    require(p.is_file(), flag, str(path), f"must be an existing {what}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(flag, str(path), f"must be UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start} "
                          "is not)") from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ConfigError(flag, str(path), f"must be valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(flag, str(path), "must be valid YAML: nesting too deep") from None
    require(raw is not None, flag, str(path), f"is empty: a {what} needs at least one entry")
    return raw
