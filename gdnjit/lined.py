"""Containers from YAML that remember line numbers (built by :mod:`gdnjit.yamlio`); importing them needs no YAML
library, so a process that loads only recorded specs never imports one."""

from __future__ import annotations

from typing import Any


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
