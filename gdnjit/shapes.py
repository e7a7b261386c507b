"""Shapes files: which problems a deployment runs, for ``gdnjit warm`` (and ``tune``), for any op.

Schema (``docs/shapes.md``)::

    name: str
    description: str
    models: {model_name: {dim: int, ...}}   # the dims the calls' specs take from a model (H, HV, K, V, hidden...)
    tp: [int]                 # tensor-parallel degrees (a spec's from_model divides by tp where it should)
    batch_sizes: [int]        # values of each call's batch fact (gdn: B requests; nvfp4_quantize: M tokens)
    defaults: {param: value}  # spec params shared by the calls whose spec has them
    calls:                    # each expands to the product of its list-valued params and bound dims
      - name: str
        spec: str
        params: {param: value or [values]}
        from_model: {param or fact: expr or [exprs]}   # optional: over the model's dims and tp; adds
                                                       # to / replaces the spec's own from_model
        batch_sizes: [int]    # optional: this call's batch-fact values instead of the file's

Every param and fact of a call's spec (except ``num_sms`` and the batch fact) must come from the
call's params, the defaults or a from_model binding. Shipped files live in ``gdnjit/shapes/`` and
are found by name (``qwen35`` or ``qwen35.yaml``); any other argument is a path.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Iterator

from . import expr as _expr
from .errors import SpecError
from .spec import get_spec
from .yamlio import read_yaml_file

SHAPES_DIR = Path(__file__).parent / "shapes"
_TOP = {"name", "description", "models", "tp", "batch_sizes", "defaults", "calls"}
_CALL_KEYS = {"name", "spec", "params", "from_model", "batch_sizes"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One compile-time problem of a shapes file plus the runtime facts it is called with: the spec's
    params, its fixed facts (e.g. H, HV), and the values of its batch fact (e.g. B) to ask about."""

    call: str
    model: str
    tp: int
    spec: str
    params: tuple[tuple[str, Any], ...]  # in spec order, without the params the target arch sets (from_arch)
    facts: tuple[tuple[str, int], ...]
    batch_fact: str
    batch_sizes: tuple[int, ...]


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


def _int_list(vals: Any) -> bool:
    return isinstance(vals, list) and bool(vals) and all(_pos_int(x) for x in vals)


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
        raise err("models", "expected a non-empty mapping of model name -> {dim: int}", doc, "models")
    for mname, dims in models.items():
        if not isinstance(dims, dict) or not dims or not all(
                isinstance(d, str) and d.isidentifier() and _pos_int(v) for d, v in dims.items()):
            raise err(f"models.{mname}", f"expected a mapping of dim names to positive integers, got {dims!r}",
                      models, mname)
    for k in ("tp", "batch_sizes"):
        if not _int_list(doc[k]):
            raise err(k, f"expected a non-empty list of positive integers, got {doc[k]!r}", doc, k)
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise err("defaults", "expected a mapping of spec param -> value", doc, "defaults")
    calls = doc["calls"]
    if not isinstance(calls, list) or not calls:
        raise err("calls", "expected a non-empty list of calls", doc, "calls")

    problems: list[Problem] = []
    used_defaults: set = set()
    for i, call in enumerate(calls):
        key = f"calls[{i}]"
        if not isinstance(call, dict) or set(call) - _CALL_KEYS or not {"name", "spec"} <= set(call):
            raise err(key, f"expected a mapping with name, spec (and params, from_model, batch_sizes), got {call!r}",
                      calls, i)
        cname = str(call["name"])
        try:
            spec = get_spec(str(call["spec"]))
        except ValueError as e:
            raise err(f"{key}.spec", str(e), call, "spec") from None
        call_params = call.get("params") or {}
        if not isinstance(call_params, dict):
            raise err(f"{key}.params", f"expected a mapping of spec param -> value or [values], got {call_params!r}",
                      call, "params")
        extra = set(call_params) - set(spec.param_names)
        if extra:
            raise err(f"{key}.params", f"unknown params {sorted(map(str, extra))} for spec {spec.name}", call, "params")
        by_arch = [n for n, _ in spec.from_arch]
        if set(call_params) & set(by_arch):
            raise err(f"{key}.params", f"{sorted(set(call_params) & set(by_arch))}: set from the target arch "
                      f"(from_arch of spec {spec.name}), not by a shapes file", call, "params")
        bind = dict(spec.from_model)
        own_bind = call.get("from_model") or {}
        if not isinstance(own_bind, dict):
            raise err(f"{key}.from_model", f"expected a mapping of param or fact -> expression or [expressions], "
                      f"got {own_bind!r}", call, "from_model")
        bindable = set(spec.param_names) | set(spec.facts) - {"num_sms", spec.batch_fact}
        for n, e in own_bind.items():
            if n not in bindable:
                raise err(f"{key}.from_model.{n}", f"expected a param or fact of spec {spec.name} "
                          f"({sorted(bindable)})", call, "from_model")
            for text in e if isinstance(e, list) else [e]:
                try:
                    _expr.compile_expr(str(text))
                except _expr.ExprError as ex:
                    raise err(f"{key}.from_model.{n}", str(ex), call, "from_model") from None
        bind.update(own_bind)
        params = {n: v for n, v in defaults.items() if n in spec.param_names and n not in by_arch}
        used_defaults |= set(params)
        params.update(call_params)
        for n in call_params:  # a param the call sets itself is not taken from the model
            bind.pop(n, None)
        fixed_facts = [f for f in spec.facts if f not in ("num_sms", spec.batch_fact)]
        own_params = [n for n in spec.param_names if n not in by_arch]
        missing = [n for n in (*own_params, *fixed_facts) if n not in params and n not in bind]
        if missing:
            raise err(f"{key}.params", f"missing params {sorted(missing)} (set them here or in defaults, or bind "
                      f"them with from_model)", call, "params")
        batch_sizes = call.get("batch_sizes", doc["batch_sizes"])
        if not _int_list(batch_sizes):
            raise err(f"{key}.batch_sizes", f"expected a non-empty list of positive integers, got {batch_sizes!r}",
                      call, "batch_sizes")
        names = [n for n in own_params if n not in bind]
        lists = []
        for n in names:
            vals = params[n] if isinstance(params[n], list) else [params[n]]
            if not vals:
                raise err(f"{key}.params.{n}", "an empty list of values selects nothing", call, "params")
            for v in vals:
                if not spec.accepts(n, v):
                    raise err(f"{key}.params.{n}", f"{v!r} is not allowed by spec {spec.name} "
                              f"(allowed: {spec.allowed_text(n)})", call, "params")
            lists.append(vals)
        bound = list(bind)
        for mname, dims in models.items():
            for c in spec.model_checks:
                try:
                    ok = _expr.evaluate(c.expr, dims)
                except _expr.ExprError as e:
                    raise err(f"models.{mname}", f"{c.expr}: {e} (spec {spec.name} needs it)", models, mname) from None
                if not ok:
                    raise err(f"models.{mname}", f"{c.expr} does not hold for {_dims_text(dims)}: {c.why}",
                              models, mname)
            for tp in doc["tp"]:
                values = {n: _bound_values(bind[n], dims, tp, n, mname, spec, err, models, doc) for n in bound}
                for combo in itertools.product(*lists, *(values[n] for n in bound)):
                    p = dict(zip(names + bound, combo))
                    problems.append(Problem(
                        cname, mname, tp, spec.name, tuple((n, p[n]) for n in own_params),
                        tuple((f, p[f]) for f in fixed_facts), spec.batch_fact, tuple(batch_sizes)))
    unused = set(defaults) - used_defaults
    if unused:
        raise err("defaults", f"unknown params {sorted(map(str, unused))}: no call's spec has them", doc, "defaults")
    return problems


def _bound_values(exprs: Any, dims: dict, tp: int, name: str, mname: str, spec, err, models, doc) -> list[int]:
    """The values a from_model binding gives ``name`` for one model and tp degree (each checked)."""
    out = []
    for text in exprs if isinstance(exprs, list) else [exprs]:
        text = str(text)
        try:
            value = _expr.evaluate(text, dict(dims, tp=tp))
        except _expr.ExprError as e:
            raise err(f"models.{mname}", f"{name} = {text}: {e} (model dims: {_dims_text(dims)})", models, mname) from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not _pos_int(value):
            if "tp" in _expr.names_in(text):
                raise err("tp", f"degree {tp} does not divide {name} of {mname}: {text} = {value} "
                          f"({_dims_text(dims)})", doc, "tp")
            raise err(f"models.{mname}", f"{name} = {text} = {value!r} is not a positive integer", models, mname)
        if name in spec.param_names and not spec.accepts(name, value):
            raise err(f"models.{mname}", f"{name}={value} not supported (allowed: {spec.allowed_text(name)})",
                      models, mname)
        out.append(value)
    return out


def _dims_text(dims: dict) -> str:
    return ", ".join(f"{d}={v}" for d, v in dims.items())


def params_for(problem: Problem, arch: str) -> dict[str, Any]:
    """Every param of the problem's spec for a target arch: the problem's, plus those ``from_arch`` sets."""
    spec = get_spec(problem.spec)
    given = dict(problem.params)
    given.update(spec.arch_params(arch))
    return {n: given[n] for n in spec.param_names}


def iter_facts(problem: Problem, num_sms: int) -> Iterator[dict[str, Any]]:
    """The runtime facts each listed batch-fact value calls the dispatcher with."""
    for value in problem.batch_sizes:
        yield {**dict(problem.facts), problem.batch_fact: value, "num_sms": num_sms}


def shipped_shapes() -> list[str]:
    return sorted(p.name for p in SHAPES_DIR.glob("*.yaml"))
