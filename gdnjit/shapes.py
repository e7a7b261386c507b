"""Shapes files: which problems a deployment runs, for ``gdnjit warm`` (and ``tune``).

Schema (``docs/shapes.md``)::

    name: str
    description: str
    models: {model_name: {H: int, HV: int, K: int, V: int}}
    tp: [int]                 # tensor-parallel degrees; H and HV are divided by each
    batch_sizes: [int]        # the batch sizes a server runs (graph capture sizes)
    defaults: {param: value}  # spec params shared by every call
    calls:                    # each expands to the product of its list-valued params
      - name: str
        spec: gdn
        params: {param: value or [values]}

Shipped files live in ``gdnjit/shapes/`` and are found by name (``qwen35`` or ``qwen35.yaml``);
any other argument is a path.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Iterator

from .errors import SpecError
from .spec import get_spec
from .yamlio import read_yaml_file

SHAPES_DIR = Path(__file__).parent / "shapes"
_TOP = {"name", "description", "models", "tp", "batch_sizes", "defaults", "calls"}
_MODEL_KEYS = {"H", "HV", "K", "V"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One compile-time problem of a shapes file plus the runtime facts it is called with."""

    call: str
    model: str
    tp: int
    spec: str
    params: tuple[tuple[str, Any], ...]
    batch_sizes: tuple[int, ...]
    H: int
    HV: int


def resolve_path(name_or_path: str | Path) -> Path:
    """A shipped shapes file by name (with or without ``.yaml``), else a path; ValueError if neither exists."""
    p = Path(name_or_path)
    for cand in (SHAPES_DIR / p.name, SHAPES_DIR / f"{p.name}.yaml") if p.parent == Path(".") else ():
        if cand.is_file():
            return cand
    if p.is_file():
        return p
    shipped = sorted(x.name for x in SHAPES_DIR.glob("*.yaml"))
    raise ValueError(f"shapes: no file {str(name_or_path)!r} (shipped: {shipped})")


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def load_shapes(name_or_path: str | Path) -> list[Problem]:
    """Parse and validate a shapes file into problems; SpecError names file, line, entry and key."""
    path = resolve_path(name_or_path)
    file = str(path)
    doc = read_yaml_file(path, fast=path.parent == SHAPES_DIR)  # shipped files with libyaml (yamlio.load_yaml)

    def err(key: str, reason: str, node: Any = None, sub: Any = None) -> SpecError:
        line = node.line_of(sub) if hasattr(node, "line_of") and sub is not None else getattr(node, "line", None)
        return SpecError(file, key, reason, line)

    if not isinstance(doc, dict):
        raise err("<top>", "a shapes file must be a YAML mapping", doc)
    unknown = set(doc) - _TOP
    if unknown:
        k = sorted(map(str, unknown))[0]
        raise err(k, f"unknown key (allowed: {sorted(_TOP)})", doc, k)
    for k in ("models", "tp", "batch_sizes", "calls"):
        if k not in doc:
            raise err(k, "required key is missing", doc)
    models = doc["models"]
    if not isinstance(models, dict) or not models:
        raise err("models", "expected a non-empty mapping of model name -> {H, HV, K, V}", doc, "models")
    for mname, dims in models.items():
        if not isinstance(dims, dict) or set(dims) != _MODEL_KEYS or not all(_pos_int(dims[x]) for x in _MODEL_KEYS):
            raise err(f"models.{mname}", f"expected {{H, HV, K, V}} positive integers, got {dims!r}", models, mname)
        if dims["HV"] % dims["H"]:
            raise err(f"models.{mname}", f"HV={dims['HV']} must be a multiple of H={dims['H']}", models, mname)
    for k in ("tp", "batch_sizes"):
        vals = doc[k]
        if not isinstance(vals, list) or not vals or not all(_pos_int(x) for x in vals):
            raise err(k, f"expected a non-empty list of positive integers, got {vals!r}", doc, k)
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise err("defaults", "expected a mapping of spec param -> value", doc, "defaults")
    calls = doc["calls"]
    if not isinstance(calls, list) or not calls:
        raise err("calls", "expected a non-empty list of calls", doc, "calls")

    problems: list[Problem] = []
    for i, call in enumerate(calls):
        key = f"calls[{i}]"
        if not isinstance(call, dict) or set(call) - {"name", "spec", "params"} or not {"name", "spec"} <= set(call):
            raise err(key, "expected a mapping with name, spec and params", calls, i)
        cname = str(call["name"])
        try:
            spec = get_spec(str(call["spec"]))
        except ValueError as e:
            raise err(f"{key}.spec", str(e), call, "spec") from None
        call_params = call.get("params") or {}
        if not isinstance(call_params, dict):
            raise err(f"{key}.params", f"expected a mapping of spec param -> value or [values], got {call_params!r}",
                      call, "params")
        params = dict(defaults)
        params.update(call_params)
        dims_from_model = {"K", "V"} & set(spec.param_names)
        extra = set(params) - set(spec.param_names)
        if extra:
            raise err(f"{key}.params", f"unknown params {sorted(map(str, extra))} for spec {spec.name}", call, "params")
        missing = set(spec.param_names) - set(params) - dims_from_model
        if missing:
            raise err(f"{key}.params", f"missing params {sorted(missing)} (set them here or in defaults)", call, "params")
        names = [n for n in spec.param_names if n not in dims_from_model]
        lists = []
        for n in names:
            vals = params[n] if isinstance(params[n], list) else [params[n]]
            if not vals:
                raise err(f"{key}.params.{n}", "an empty list of values selects nothing", call, "params")
            for v in vals:
                if v not in spec.allowed(n):
                    raise err(f"{key}.params.{n}", f"{v!r} is not allowed by spec {spec.name} "
                              f"(allowed: {list(spec.allowed(n))})", call, "params")
            lists.append(vals)
        for mname, dims in models.items():
            for tp in doc["tp"]:
                if dims["H"] % tp or dims["HV"] % tp:
                    raise err("tp", f"degree {tp} does not divide the heads of {mname} (H={dims['H']}, HV={dims['HV']})",
                              doc, "tp")
                for combo in itertools.product(*lists):
                    p = dict(zip(names, combo))
                    for d in dims_from_model:
                        if dims[d] not in spec.allowed(d):
                            raise err(f"models.{mname}", f"{d}={dims[d]} not supported (allowed: {list(spec.allowed(d))})",
                                      models, mname)
                        p[d] = dims[d]
                    problems.append(Problem(cname, mname, tp, spec.name, tuple((n, p[n]) for n in spec.param_names),
                                            tuple(doc["batch_sizes"]), dims["H"] // tp, dims["HV"] // tp))
    return problems


def iter_facts(problem: Problem, num_sms: int) -> Iterator[dict[str, Any]]:
    """The runtime facts each listed batch size calls the dispatcher with."""
    for B in problem.batch_sizes:
        yield {"B": B, "H": problem.H, "HV": problem.HV, "num_sms": num_sms}


def shipped_shapes() -> list[str]:
    return sorted(p.name for p in SHAPES_DIR.glob("*.yaml"))
