"""YAML loading that remembers line numbers, so errors can point at the offending line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .lined import LineDict, LineList


class _Loader(yaml.SafeLoader):
    pass


# libyaml's parser (PyYAML's C extension, when built) with the same Python constructors: ~8x faster on a
# spec, for gdnjit's own files (see load_yaml).
_CLoader = type("_CLoader", (yaml.CSafeLoader,), {}) if getattr(yaml, "__with_libyaml__", False) else None


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


for _cls in (_Loader, _CLoader) if _CLoader else (_Loader,):
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_yaml(text: str, file: str, *, fast: bool = False) -> Any:
    """Parse ``text`` (named ``file`` in errors) into LineDict/LineList/scalars; SpecError on bad YAML.

    ``fast``: parse with libyaml when PyYAML has it. libyaml accepts a few things the pure-Python loader
    refuses or reads otherwise (a tab as a space after a value, an empty tag ``!``, ``?`` in a flow
    collection, ``|#``), so only gdnjit's own files are loaded so, and a test loads each of them both ways
    (tests/test_spec.py). A text libyaml refuses is parsed again by the pure-Python loader, whose message
    and line the error then has."""
    if fast and _CLoader is not None:
        try:
            return yaml.load(text, Loader=_CLoader)  # noqa: S506 - CSafeLoader subclass
        except Exception:  # noqa: BLE001 - the pure-Python loader below decides and reports
            pass
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(file, "<yaml>", f"{e.problem or e.context}", line) from None
    except yaml.YAMLError as e:
        raise SpecError(file, "<yaml>", str(e)) from None


def read_yaml_file(path: Path, *, fast: bool = False) -> Any:
    """Read and parse a YAML file; SpecError naming the file when it cannot be read or parsed (``fast``: see
    load_yaml)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), "<file>", f"cannot read: {e}") from None
    return load_yaml(text, str(path), fast=fast)
