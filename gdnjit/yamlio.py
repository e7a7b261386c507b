"""YAML loading that remembers line numbers, so errors can point at the offending line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError


class LineDict(dict):
    """A dict from YAML that knows the line of each key (``.line_of(key)``) and its own line."""

    line: int | None = None
    key_lines: dict

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)


class LineList(list):
    """A list from YAML that knows the line of each item (``.line_of(index)``)."""

    line: int | None = None
    item_lines: list

    def line_of(self, index: int) -> int | None:
        lines = getattr(self, "item_lines", [])
        return lines[index] if 0 <= index < len(lines) else self.line


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)):
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable or complex key {key!r}", key_node.start_mark
            )
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_yaml(text: str, file: str) -> Any:
    """Parse ``text`` (named ``file`` in errors) into LineDict/LineList/scalars; SpecError on bad YAML."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(file, "<yaml>", f"{e.problem or e.context}", line) from None
    except yaml.YAMLError as e:
        raise SpecError(file, "<yaml>", str(e)) from None


def read_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file; SpecError naming the file when it cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), "<file>", f"cannot read: {e}") from None
    return load_yaml(text, str(path))
