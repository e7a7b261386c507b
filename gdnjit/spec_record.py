"""Validated shipped specs, recorded: loading a shipped spec without parsing and checking it again.

Parsing a spec checks every expression (Jinja's lexer: ~0.25 ms each, ~110 in ``gdn.yaml``) and that
every parameter combination has a fallback rule; together ~50-100 ms of CPU, which a serving process
paid per op. ``specs/validated.json`` records, per shipped spec file, the validated :class:`Spec` as
JSON, keyed by a digest of the YAML bytes and of the code that validates them (``_VALIDATOR``), with the
analysis of each of its expressions (free names, conjuncts, compiled by Python or by Jinja:
:func:`gdnjit.expr.analyse`), which a load hands to :func:`gdnjit.expr.seed` so that a first dispatch parses
no expression. :func:`gdnjit.spec.get_spec` takes the record when the digest matches and parses the
file otherwise (an edited spec, or edited validator code: correct, only slower). ``python -m
gdnjit.spec_record`` rewrites the records; a CPU test fails while they are stale.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

RECORDS = Path(__file__).parent / "specs" / "validated.json"
_VALIDATOR = ("spec.py", "expr.py", "expr_common.py", "expr_jinja.py", "yamlio.py", "lined.py")


@functools.lru_cache(maxsize=1)
def _validator_digest() -> bytes:
    h = hashlib.sha256()
    for name in _VALIDATOR:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.digest()


def digest(yaml_bytes: bytes) -> str:
    """The key of a spec file's record: its bytes and the validator's code."""
    return hashlib.sha256(_validator_digest() + yaml_bytes).hexdigest()


def _to_json(x: Any) -> Any:
    if dataclasses.is_dataclass(x):
        return {"__type__": type(x).__name__, **{f.name: _to_json(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, tuple):
        return [_to_json(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"spec_record: cannot record a {type(x).__name__}")


def _from_json(x: Any, types: dict) -> Any:
    if isinstance(x, dict):
        cls = types[x["__type__"]]
        return cls(**{k: _from_json(v, types) for k, v in x.items() if k != "__type__"})
    if isinstance(x, list):
        return tuple(_from_json(v, types) for v in x)
    return x


@functools.lru_cache(maxsize=1)
def _records() -> dict:
    try:
        return json.loads(RECORDS.read_text())
    except (OSError, ValueError):
        return {}


def lookup(file_name: str, yaml_bytes: bytes) -> dict | None:
    """The record of shipped file ``file_name`` if it matches these bytes (its expressions' analyses are seeded
    into :mod:`gdnjit.expr`), else None. :func:`gdnjit.spec.recorded_spec` decodes it into a Spec."""
    rec = _records().get(file_name)
    if rec is None or rec.get("digest") != digest(yaml_bytes):
        return None
    from . import expr

    expr.seed(rec["expressions"])
    return rec["spec"]


def decode(record: Any, types: dict) -> Any:
    """A recorded value back as the objects it was recorded from (``types``: class name -> class)."""
    return _from_json(record, types)


def expression_analyses(spec) -> dict:
    """:func:`gdnjit.expr.analyse` of every expression of ``spec`` and of every conjunct of one (each is
    evaluated alone): what a record seeds so that loading it parses no expression."""
    from . import expr

    out = {}
    for text in spec.expressions():
        for t in (text, *expr.conjuncts(text)):
            out[t] = expr.analyse(t)
    return out


def write_records(specs: dict) -> dict:
    """Write ``validated.json`` from ``{file name: (yaml bytes, the Spec parsed and validated from them)}``."""
    out = {name: {"digest": digest(data), "spec": _to_json(spec),
                  "expressions": {t: _to_json(a) for t, a in expression_analyses(spec).items()}}
           for name, (data, spec) in specs.items()}
    RECORDS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    _records.cache_clear()
    return out


if __name__ == "__main__":  # python -m gdnjit.spec_record: parse every shipped spec afresh and record it
    from gdnjit.spec import SPEC_DIR, list_specs, load_spec_file

    paths = [SPEC_DIR / f"{name}.yaml" for name in list_specs()]
    written = write_records({p.name: (p.read_bytes(), load_spec_file(p)) for p in paths})
    print(f"recorded {', '.join(written)} in {RECORDS}")
