"""Kernel specs: YAML files listing a kernel family's parameters, tunables, constraints and
dispatch rules. Loading validates everything and reports file, line, key and reason.

Schema (see ``docs/specs.md`` for the guide)::

    name: str                    # unique spec name
    description: str
    template: file.cu.j2         # under gdnjit/templates; may name params/tunables: gdn_{form}.cu.j2
    kernel_name: str             # extern "C" entry point
    module: str                  # optional: the op module (gdnjit.<module>) that builds the spec's calls;
                                 # its example_call(params, facts, device) gives `gdnjit tune` inputs
    params:   {name: [values]}   # compile-time parameters fixed by the call (dtypes, K, T, flags)
    param_domains: {name: expr}  # optional: an integer param may take any value for which expr holds
                                 # (compiled on first use); its list is what warm and the checks enumerate
    tunables: {name: [values]}   # compile-time choices the dispatcher makes
    derived:  {name: expr}       # values computed from params + tunables (+ earlier derived)
    constraints: [{expr: str, why: str}]     # must all hold for a valid variant
    facts: [names]               # runtime facts the rules and launch may use (B, HV, num_sms, ...)
    batch_fact: name             # optional (default: the first fact): the fact that grows with the load;
                                 # shapes files list its values, tuned entries serve values within 2x
    from_model: {name: expr}     # optional: params / facts a shapes file takes from a model's dims
                                 # (an expression over the dims and tp), unless a call binds them itself
    model_checks: [{expr: str, why: str}]    # optional: what a shapes file's model dims must satisfy
    from_arch: {param: expr}     # optional: params the target arch decides (an expression over `arch`,
                                 # e.g. 100 for sm_100a); warm / tune set them, shapes files do not
    dispatch_params: {param: expr}  # optional: the value of a param the rules and tuned tables see (an
                                 # expression over the params): call modes that compute alike dispatch alike,
                                 # so they get the same tunables and bit-identical results
    invariant_batch: int         # optional: the batch fact's value the rules and tuned tables see in
                                 # batch-invariant mode (GDNJIT_BATCH_INVARIANT=1): one variant for every batch
    rules: [{when: expr?, use: {tunable: value}, why: str}]  # ordered; first valid match wins
    retile_may_set: [tunable]    # optional: the tunables retile may change (those that leave the arithmetic
                                 # alone, e.g. rows per thread): a call mode dispatch_params hides keeps its bits
    retile: [{when: expr, use: {tunable: value}, why: str}]  # optional, ordered: after the rules or a tuned
                                 # entry chose, the first entry whose when holds over the call's own params, the
                                 # chosen tunables and the facts (as dispatch sees them), with valid tunables,
                                 # changes those it names
    launch: {grid: expr, block: expr, smem: expr}             # over facts + variant values
    args: {name: ptr|i64|i32|f32}  # the kernel's one by-value argument struct, in order; "TYPE = DEFAULT" gives an
                                 # argument a default (a pointer's null, a zero stride, ...): a calling mode names
                                 # only the args it sets (gdnjit.call_mode), the others are required
    param_defaults: {param: value}  # optional: the value a calling mode that does not name a param gets (the
                                 # "off" value of a mode flag); params without one are required
    first_launch: {when: expr, params: {param: value}, pin: [tunable], why: str}  # optional: a launch a call makes
                                 # before its own where `when` holds over its params and tunables: the same call
                                 # with `params` set, the `pin` tunables pinned to the call's values (the runner
                                 # chooses the rest); warm plans it beside the call
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import math
import string
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from . import expr as _expr
from .errors import SpecError
from .lined import LineDict, LineList

SPEC_DIR = Path(__file__).parent / "specs"
_SCALAR = (bool, int, float, str)
_TOP_KEYS = {
    "name", "description", "template", "kernel_name", "module", "params", "param_domains", "tunables", "derived",
    "constraints", "facts", "batch_fact", "from_model", "model_checks", "from_arch", "rules", "launch", "args",
    "dispatch_params", "invariant_batch", "retile_may_set", "retile", "param_defaults", "first_launch",
}
ARG_TYPES = ("ptr", "i64", "i32", "f32")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One dispatch rule: if ``when`` holds (or is None), use these tunables."""

    when: str | None
    use: tuple[tuple[str, Any], ...]
    why: str
    line: int | None = None


@dataclasses.dataclass(frozen=True)
class Constraint:
    expr: str
    why: str
    line: int | None = None


@dataclasses.dataclass(frozen=True)
class FirstLaunch:
    """A launch a call makes before its own (spec key ``first_launch``)."""

    when: str  # over the call's params and tunables
    params: tuple[tuple[str, Any], ...]  # the params it changes
    pin: tuple[str, ...]  # the tunables it takes from the call
    why: str = ""


_DISPATCH_VIEWS: dict = {}  # (spec, params items) -> Spec.dispatch_view (bounded)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A validated kernel spec. Immutable; build with :func:`load_spec_file` or :func:`get_spec`."""

    name: str
    description: str
    template: str  # as written: a file name, or a pattern with {param} / {tunable} placeholders
    kernel_name: str
    params: tuple[tuple[str, tuple], ...]
    tunables: tuple[tuple[str, tuple], ...]
    derived: tuple[tuple[str, str], ...]
    constraints: tuple[Constraint, ...]
    facts: tuple[str, ...]
    rules: tuple[Rule, ...]
    launch: tuple[tuple[str, str], ...]
    args: tuple[tuple[str, str], ...]
    file: str
    domains: tuple[tuple[str, str], ...] = ()  # param -> expression over it: values accepted beyond the list
    batch_fact: str = ""  # the fact shapes files list values of and tuned entries match within 2x ("" if no facts)
    from_model: tuple[tuple[str, str], ...] = ()  # param / fact -> expression over a model's dims and tp
    model_checks: tuple[Constraint, ...] = ()  # over a shapes file's model dims
    from_arch: tuple[tuple[str, str], ...] = ()  # param -> expression over the target arch number
    module: str = ""  # the op module under gdnjit that builds this spec's calls ("" if none)
    dispatch_params: tuple[tuple[str, str], ...] = ()  # param -> expression over params: what dispatch sees
    invariant_batch: int = 0  # the batch fact's value dispatch sees in batch-invariant mode (0: none)
    retile_may_set: tuple[str, ...] = ()  # the tunables a retile entry may change
    retile: tuple[Rule, ...] = ()  # after the choice, over the call's own params + the chosen tunables + facts
    arg_defaults: tuple[tuple[str, Any], ...] = ()  # arg -> the value a calling mode that does not name it passes
    param_defaults: tuple[tuple[str, Any], ...] = ()  # param -> the value a calling mode that does not name it gets
    first_launch: FirstLaunch | None = None  # a launch a call makes before its own (where its `when` holds)

    def dispatch_view(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` as the rules and tuned tables see them (``dispatch_params`` applied, each over the
        call's own params): modes with the same arithmetic get the same tunables."""
        if not self.dispatch_params:
            return dict(params)
        # memoised on the params (a warm plan asks for the same few thousand times: ~45% of a cached warm's time)
        try:
            key = (self, tuple(params.items()))
            hit = _DISPATCH_VIEWS.get(key)
        except TypeError:  # an unhashable value: computed, not memoised
            key = hit = None
        if hit is not None:
            return dict(hit)
        view = dict(params)
        for n, e in self.dispatch_params:
            if n in params and _expr.names_in(e) <= params.keys():  # a partial dict: what it holds
                view[n] = _expr.evaluate(e, params)
        if key is not None:
            if len(_DISPATCH_VIEWS) >= 4096:
                _DISPATCH_VIEWS.clear()
            _DISPATCH_VIEWS[key] = view
        return dict(view)

    def dispatch_facts(self, facts: Mapping[str, Any], batch_invariant: bool) -> dict[str, Any]:
        """``facts`` as the rules and tuned tables see them: in batch-invariant mode the batch fact is
        ``invariant_batch`` (one variant, hence one arithmetic order, for every batch size)."""
        if batch_invariant and self.invariant_batch and self.batch_fact in facts:
            return dict(facts, **{self.batch_fact: self.invariant_batch})
        return dict(facts)

    def arch_params(self, arch: str) -> dict[str, Any]:
        """The params ``from_arch`` sets for a target like ``sm_100a`` (what the op sets from the device)."""
        number = int(str(arch)[3:].rstrip("af"))
        return {n: _expr.evaluate(e, {"arch": number}) for n, e in self.from_arch}

    def __hash__(self) -> int:
        # memoised: a spec keys the validity caches, which hash it once per candidate checked
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.params)

    @property
    def tunable_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.tunables)

    @property
    def template_fields(self) -> tuple[str, ...]:
        """The params / tunables the template name depends on (``{form}`` in ``gdn_{form}.cu.j2``); () for a
        plain name."""
        return template_fields(self.template)

    def template_for(self, values: Mapping[str, Any]) -> str:
        """The template file of one variant: the template name with its placeholders expanded from ``values``
        (params + tunables; each value formatted with ``str``)."""
        return self.template.format_map({n: values[n] for n in self.template_fields})

    def template_expansions(self) -> list[tuple[dict[str, Any], str]]:
        """Every (placeholder values, template file) the allowed values give, in the order of the values."""
        names = self.template_fields
        out = []
        for combo in itertools.product(*(self.allowed(n) for n in names)):
            values = dict(zip(names, combo))
            out.append((values, self.template_for(values)))
        return out

    def describe_template(self) -> str:
        """``t.cu.j2``, or ``gdn_{form}.cu.j2 (form=recurrent: gdn_recurrent.cu.j2, ...)``: for the command line."""
        if not self.template_fields:
            return self.template
        shown = ", ".join(f"{' '.join(f'{n}={v}' for n, v in values.items())}: {name}"
                          for values, name in self.template_expansions())
        return f"{self.template} ({shown})"

    def allowed(self, name: str) -> tuple:
        """Allowed values of a param or tunable."""
        for n, vals in self.params + self.tunables:
            if n == name:
                return vals
        raise KeyError(name)

    def allowed_text(self, name: str) -> str:
        """Param ``name``'s allowed values for an error message: the list, and its domain where it has one."""
        domain = dict(self.domains).get(name)
        return f"{list(self.allowed(name))}" + (f" or an integer with {domain}" if domain else "")

    def check_params(self, params: Mapping[str, Any]) -> None:
        """ValueError unless ``params`` has exactly the spec's params with allowed values."""
        names = set(self.param_names)
        if set(params) != names:
            raise ValueError(
                f"spec {self.name}: params must be exactly {sorted(names)}, got {sorted(params)}"
            )
        for n, _ in self.params:
            if not self.accepts(n, params[n]):
                raise ValueError(f"spec {self.name}: param {n} must be one of {self.allowed_text(n)}, got {params[n]!r}")

    def accepts(self, name: str, value: Any) -> bool:
        """Whether param ``name`` may take ``value``: a listed value, or an integer in its domain."""
        if value in self.allowed(name):
            return True
        domain = dict(self.domains).get(name)
        if domain is None or isinstance(value, bool) or not isinstance(value, int):
            return False
        try:
            return bool(_expr.evaluate(domain, {name: value}))
        except _expr.ExprError:
            return False

    def variant_values(self, params: Mapping[str, Any], tunables: Mapping[str, Any]) -> dict[str, Any]:
        """params + tunables + derived values, in one dict (the template and launch context)."""
        values = dict(params)
        values.update(tunables)
        for n, e in self.derived:
            values[n] = _expr.evaluate(e, values)
        return values

    def violations(self, params: Mapping[str, Any], tunables: Mapping[str, Any]) -> list[str]:
        """The constraints (with their reasons) that ``params`` + ``tunables`` break; [] if valid."""
        return list(_violations(self, tuple(params.items()), tuple(tunables.items())))

    def _violations(self, params: Mapping[str, Any], tunables: Mapping[str, Any]) -> list[str]:
        for n, vals in self.tunables:
            if tunables.get(n) not in vals:
                return [f"tunable {n} must be one of {list(vals)}, got {tunables.get(n)!r}"]
        try:
            values = self.variant_values(params, tunables)
        except _expr.ExprError as e:
            return [str(e)]
        bad = []
        for c in self.constraints:
            try:
                ok = bool(_expr.evaluate(c.expr, values))
            except _expr.ExprError as e:
                ok, c = False, Constraint(c.expr, str(e), c.line)
            if not ok:
                bad.append(f"{c.expr} ({c.why})")
        return bad

    def valid(self, params: Mapping[str, Any], tunables: Mapping[str, Any]) -> bool:
        """``not self.violations(params, tunables)``, decided at the first broken constraint: the derived
        values are computed only as the constraints read them (the candidate searches of dispatch, tune
        and warm reject most combinations on a constraint that reads no derived value)."""
        return _valid(self, tuple(params.items()), tuple(tunables.items()))

    def expressions(self) -> tuple[str, ...]:
        """Every expression text of the spec (derived values, constraints, rules, launch, domains, model and
        arch mappings, model checks), each once, in spec order."""
        texts = [e for _, e in self.derived] + [c.expr for c in self.constraints]
        texts += [r.when for r in self.rules if r.when is not None] + [e for _, e in self.launch]
        texts += [r.when for r in self.retile]
        texts += [e for table in (self.domains, self.from_model, self.from_arch, self.dispatch_params) for _, e in table]
        texts += [c.expr for c in self.model_checks]
        texts += [self.first_launch.when] if self.first_launch else []
        return tuple(dict.fromkeys(texts))

    def first_launch_of(self, params: Mapping[str, Any], tunables: Mapping[str, Any]) -> tuple[dict, dict] | None:
        """``(params, pinned tunables)`` of the launch a call of these params and tunables makes before its own
        (spec key ``first_launch``: the same call with its ``params`` set, its ``pin`` tunables the call's), or
        None when it makes none."""
        fl = self.first_launch
        if fl is None or not _expr.evaluate(fl.when, {**params, **tunables}):
            return None
        return dict(params, **dict(fl.params)), {n: tunables[n] for n in fl.pin}

    def all_tunable_choices(self) -> list[dict[str, Any]]:
        """Every combination of tunable values (valid or not)."""
        names = self.tunable_names
        return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in self.tunables))]


@functools.lru_cache(maxsize=65536)
def _violations(spec: Spec, params: tuple, tunables: tuple) -> tuple[str, ...]:
    return tuple(spec._violations(dict(params), dict(tunables)))


class _LazyValues(Mapping):
    """params + tunables, with each derived value computed when first read (a derived expression reads
    only params, tunables and earlier derived values: parse_spec checks that, so there is no cycle)."""

    def __init__(self, spec: Spec, params: tuple, tunables: tuple):
        self._values = dict(params)
        self._values.update(tunables)
        self._derived = dict(spec.derived)

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            if name not in self._derived:
                raise KeyError(name)
            self._values[name] = _expr.evaluate(self._derived[name], self)
        return self._values[name]

    def __iter__(self):
        return iter(dict.fromkeys([*self._values, *self._derived]))

    def __len__(self) -> int:
        return len(set(self._values) | set(self._derived))


@functools.lru_cache(maxsize=65536)
def _valid(spec: Spec, params: tuple, tunables: tuple) -> bool:
    given = dict(tunables)
    if any(given.get(n) not in vals for n, vals in spec.tunables):
        return False
    values = _LazyValues(spec, params, tunables)
    try:
        if not all(_expr.evaluate(c.expr, values) for c in spec.constraints):
            return False
        for n in values:  # every derived value must evaluate, as in violations()
            values[n]
    except _expr.ExprError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def template_fields(template: str) -> tuple[str, ...]:
    """The placeholder names of a template name, in order of first use; ValueError if it is not a plain
    ``str.format`` pattern of ``{name}`` fields (no positional fields, attributes, indexes, conversions or format
    specs; ``{{`` and ``}}`` are literal braces)."""
    names: list[str] = []
    for _text, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(f"placeholder {{{shown}}}: expected {{name}} with the name of a param or tunable")
        if field not in names:
            names.append(field)
    return tuple(names)


def _check_template(template: str, params, tunables, file: str, doc: Any) -> None:
    """The template name's placeholders name params / tunables, and every expansion of them over their
    allowed values names an existing template."""
    from .render import template_exists

    try:
        names = template_fields(template)
    except ValueError as e:
        raise _err(file, "template", f"{template!r}: {e}", doc, "template") from None
    allowed = dict(params) | dict(tunables)
    for n in names:
        if n not in allowed:
            raise _err(file, "template", f"{template!r}: placeholder {{{n}}} is not a param or tunable "
                                         f"(known: {sorted(allowed)})", doc, "template")
    for combo in itertools.product(*(allowed[n] for n in names)):
        values = dict(zip(names, combo))
        name = template.format_map(values)
        if not template_exists(name):
            where = f" (for {', '.join(f'{n}={v!r}' for n, v in values.items())})" if names else ""
            raise _err(file, "template", f"no template named {name!r}{where} in gdnjit/templates", doc, "template")


def _line(node: Any, sub: Any) -> int | None:
    """Line of ``node[sub]`` when the document came from gdnjit's YAML loader (plain data has none)."""
    return node.line_of(sub) if isinstance(node, (LineDict, LineList)) else None


def _err(file: str, key: str, reason: str, node: Any = None, sub: Any = None) -> SpecError:
    line = None
    if isinstance(node, (LineDict, LineList)):
        line = node.line_of(sub) if sub is not None else node.line
    return SpecError(file, key, reason, line)


def _values_table(doc: LineDict, key: str, file: str, required: bool) -> tuple[tuple[str, tuple], ...]:
    table = doc.get(key, LineDict())
    if not isinstance(table, dict) or (required and not table):
        raise _err(file, key, "expected a non-empty mapping of name -> list of allowed values", doc, key)
    out = []
    for name, vals in table.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise _err(file, f"{key}.{name}", "names must be identifiers", table, name)
        if not isinstance(vals, list) or not vals:
            raise _err(file, f"{key}.{name}", f"expected a non-empty list of values, got {vals!r}", table, name)
        for v in vals:
            if not isinstance(v, _SCALAR):
                raise _err(file, f"{key}.{name}", f"values must be scalars, got {v!r}", table, name)
        if len(set(map(repr, vals))) != len(vals):
            raise _err(file, f"{key}.{name}", "duplicate values", table, name)
        out.append((name, tuple(vals)))
    return tuple(out)


def _expr_str(value: Any, file: str, key: str, node: Any, sub: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _err(file, key, f"expected an expression string, got {value!r}", node, sub)
    text = str(value)
    try:  # refuses exactly what compile_expr refuses, mostly without compiling (that waits for a first use)
        _expr.check_expr(text)
    except _expr.ExprError as e:
        raise _err(file, key, str(e), node, sub) from None
    return text


def _shapes_keys(doc: LineDict, file: str, params: tuple, facts: tuple) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``batch_fact`` (default: the first fact other than num_sms) and ``from_model`` (param or fact ->
    expression over a shapes file's model dims and ``tp``: checked for syntax here, for names at
    shapes-file load)."""
    candidates = [f for f in facts if f != "num_sms"]
    batch = doc.get("batch_fact", candidates[0] if candidates else "")
    if batch not in candidates and (batch or candidates):
        raise _err(file, "batch_fact", f"expected one of the facts {candidates}, got {batch!r}", doc, "batch_fact")
    table = _section(doc, file, "from_model", "param or fact -> expression")
    out = []
    for name, e in table.items():
        key = f"from_model.{name}"
        if name not in dict(params) and name not in candidates:
            raise _err(file, key, f"must name a param or a fact ({sorted(dict(params))}, {candidates})", table, name)
        if name == batch:
            raise _err(file, key, f"{name} is the batch fact: shapes files list its values", table, name)
        out.append((name, _expr_str(e, file, key, table, name)))
    return batch, tuple(out)


def _section(doc: LineDict, file: str, section: str, what: str) -> LineDict:
    """The mapping at ``section`` ({} if absent); SpecError naming it if it is not a mapping of ``what``."""
    table = doc.get(section, LineDict())
    if not isinstance(table, dict):
        raise _err(file, section, f"expected a mapping of {what}", doc, section)
    return table


def _param_expressions(doc: LineDict, file: str, params: tuple, section: str, what: str, reads) -> list:
    """``section``: a mapping of param name -> an expression that may read only the name ``reads(param)``;
    [(param, text, the mapping)] in file order (SpecError naming the entry otherwise)."""
    table = _section(doc, file, section, what)
    out = []
    for name, e in table.items():
        key = f"{section}.{name}"
        if name not in dict(params):
            raise _err(file, key, f"must name a param ({sorted(dict(params))})", table, name)
        text = _expr_str(e, file, key, table, name)
        if _expr.names_in(text) - {reads(name)}:
            raise _err(file, key, f"may read only {reads(name)}, reads {sorted(_expr.names_in(text))}", table, name)
        out.append((name, text, table))
    return out


def _dispatch_params(doc: LineDict, file: str, params: tuple) -> tuple[tuple[str, str], ...]:
    """``dispatch_params``: param -> an expression over the params giving the value dispatch sees; for
    every combination of the params it reads, the value must be one the param lists."""
    table = _section(doc, file, "dispatch_params", "param -> expression over the params")
    allowed = dict(params)
    out = []
    for name, e in table.items():
        key = f"dispatch_params.{name}"
        if name not in allowed:
            raise _err(file, key, f"must name a param ({sorted(allowed)})", table, name)
        text = _expr_str(e, file, key, table, name)
        reads = sorted(_expr.names_in(text))
        if set(reads) - set(allowed):
            raise _err(file, key, f"may read only params, reads {sorted(set(reads) - set(allowed))}", table, name)
        for combo in itertools.product(*(allowed[n] for n in reads)):
            try:
                value = _expr.evaluate(text, dict(zip(reads, combo)))
            except _expr.ExprError as err:
                raise _err(file, key, f"fails to evaluate for {dict(zip(reads, combo))}: {err}", table, name) from None
            if value not in allowed[name]:
                raise _err(file, key, f"gives {value!r} for {dict(zip(reads, combo))}, not one of {list(allowed[name])}",
                           table, name)
        out.append((name, text))
    return tuple(out)


def _retile(doc: LineDict, file: str, tunables: tuple, names: set) -> tuple[tuple[str, ...], tuple[Rule, ...]]:
    """``retile_may_set`` (tunable names) and ``retile`` (entries whose ``when`` reads params, tunables and facts
    and whose ``use`` sets some of those tunables to allowed values)."""
    allowed = dict(tunables)
    may_doc = doc.get("retile_may_set", LineList())
    if (not isinstance(may_doc, list) or any(not isinstance(n, str) or n not in allowed for n in may_doc)
            or len(set(may_doc)) != len(may_doc)):
        raise _err(file, "retile_may_set", f"expected a list of distinct tunable names ({list(allowed)}), "
                   f"got {may_doc!r}", doc, "retile_may_set")
    may = tuple(may_doc)
    entries_doc = doc.get("retile", LineList())
    if not isinstance(entries_doc, list):
        raise _err(file, "retile", "expected a list of {when, use, why}", doc, "retile")
    out = []
    for i, r in enumerate(entries_doc):
        key = f"retile[{i}]"
        if not isinstance(r, dict) or set(r) - {"when", "use", "why"} or not {"when", "use"} <= set(r):
            raise _err(file, key, "expected a mapping with keys when and use (and why)", entries_doc, i)
        use = r["use"]
        if not isinstance(use, dict) or not use or set(use) - set(may):
            raise _err(file, key + ".use", f"may set only the tunables retile_may_set lists ({list(may)}), got "
                       f"{sorted(use, key=str) if isinstance(use, dict) else use!r}", r, "use")
        for n, v in use.items():
            if v not in allowed[n]:
                raise _err(file, f"{key}.use.{n}", f"{v!r} is not an allowed value {list(allowed[n])}", use, n)
        when = _expr_str(r["when"], file, key + ".when", r, "when")
        missing = _expr.names_in(when) - names
        if missing:
            raise _err(file, key + ".when", f"may read params, tunables and facts; unknown names {sorted(missing)}",
                       r, "when")
        out.append(Rule(when, tuple(use.items()), str(r.get("why", "")), _line(entries_doc, i)))
    return may, tuple(out)


def _first_launch(doc: LineDict, file: str, params: tuple, tunables: tuple) -> FirstLaunch | None:
    """``first_launch``: ``when`` over params and tunables, ``params`` (param names -> allowed values), ``pin``
    (distinct tunable names), ``why``."""
    fl = doc.get("first_launch")
    if fl is None:
        return None
    if (not isinstance(fl, dict) or set(fl) - {"when", "params", "pin", "why"}
            or not {"when", "params", "pin"} <= set(fl)):
        raise _err(file, "first_launch", "expected a mapping with keys when, params and pin (and why)", doc,
                   "first_launch")
    when = _expr_str(fl["when"], file, "first_launch.when", fl, "when")
    missing = _expr.names_in(when) - set(dict(params)) - set(dict(tunables))
    if missing:
        raise _err(file, "first_launch.when", f"may read params and tunables; unknown names {sorted(missing)}", fl,
                   "when")
    changed = fl["params"]
    if not isinstance(changed, dict) or not changed or set(changed) - set(dict(params)):
        raise _err(file, "first_launch.params", f"expected a mapping of param names ({list(dict(params))}) to values, "
                   f"got {changed!r}", fl, "params")
    for n, v in changed.items():
        if v not in dict(params)[n]:
            raise _err(file, f"first_launch.params.{n}", f"{v!r} is not an allowed value {list(dict(params)[n])}",
                       changed, n)
    pin = fl["pin"]
    if (not isinstance(pin, list) or any(not isinstance(n, str) or n not in dict(tunables) for n in pin)
            or len(set(pin)) != len(pin)):
        raise _err(file, "first_launch.pin", f"expected a list of distinct tunable names ({list(dict(tunables))}), "
                   f"got {pin!r}", fl, "pin")
    return FirstLaunch(when, tuple(changed.items()), tuple(pin), str(fl.get("why", "")))


def _param_domains(doc: LineDict, file: str, params: tuple) -> tuple[tuple[str, str], ...]:
    """``param_domains``: integer params that accept any value for which an expression over the param
    alone holds; every listed value must be inside (the list is what warm and the checks enumerate)."""
    out = []
    for name, text, table in _param_expressions(doc, file, params, "param_domains", "param name -> expression",
                                                lambda name: name):
        key = f"param_domains.{name}"
        for v in dict(params)[name]:
            if isinstance(v, bool) or not isinstance(v, int):
                raise _err(file, key, f"only integer params take a domain; {name} lists {v!r}", table, name)
            try:
                inside = _expr.evaluate(text, {name: v})
            except _expr.ExprError as err:
                raise _err(file, key, str(err), table, name) from None
            if not inside:
                raise _err(file, key, f"the listed value {v} is outside the domain", table, name)
        out.append((name, text))
    return tuple(out)


def _args(doc: LineDict, file: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]:
    """The kernel's arguments, ``name: type`` (required) or ``name: type = default`` (a calling mode that does not
    name it passes the default: ``null`` or ``0`` for a pointer, a number otherwise); ((name, type), ...) in order
    and ((name, default), ...)."""
    args_doc = doc["args"]
    if not isinstance(args_doc, dict) or not args_doc:
        raise _err(file, "args", "expected a non-empty mapping of name -> type", doc, "args")
    args, defaults = [], []
    for n, text in args_doc.items():
        ty, eq, default = str(text).partition("=") if isinstance(text, str) else (text, "", "")
        ty, default = str(ty).strip(), default.strip()
        if not isinstance(n, str) or not n.isidentifier() or ty not in ARG_TYPES or (eq and not default):
            raise _err(file, f"args.{n}", f"expected an identifier mapped to one of {ARG_TYPES}, optionally with "
                       f"'= default', got {text!r}", args_doc, n)
        args.append((n, ty))
        if eq:
            defaults.append((n, _arg_default(file, n, ty, default, args_doc)))
    return tuple(args), tuple(defaults)


def _arg_default(file: str, name: str, ty: str, text: str, node: Any) -> Any:
    """An argument's default: a pointer's ``null`` (0), an integer for i32 / i64 (in range), a number for f32."""
    try:
        if ty == "ptr":
            if text not in ("null", "0"):
                raise ValueError
            return 0
        if ty == "f32":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        value = int(text)
        bits = 32 if ty == "i32" else 64
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise ValueError
        return value
    except ValueError:
        want = {"ptr": "null (or 0)", "f32": "a finite number", "i32": "a 32-bit integer", "i64": "a 64-bit integer"}
        raise _err(file, f"args.{name}", f"default: expected {want[ty]} for a {ty}, got {text!r}", node, name) from None


def _param_defaults(doc: LineDict, file: str, params: tuple, domains: tuple) -> tuple[tuple[str, Any], ...]:
    """``param_defaults``: the value a calling mode that does not name a param gets (each an allowed value)."""
    table = _section(doc, file, "param_defaults", "param -> default value")
    allowed = dict(params)
    domain = dict(domains)
    out = []
    for n, value in table.items():
        if n not in allowed:
            raise _err(file, f"param_defaults.{n}", f"expected a param of the spec ({', '.join(allowed)}), got {n!r}",
                       table, n)
        ok = value in allowed[n] and isinstance(value, bool) == isinstance(allowed[n][0], bool)
        if not ok and n in domain and isinstance(value, int) and not isinstance(value, bool):
            try:
                ok = bool(_expr.evaluate(domain[n], {n: value}))
            except _expr.ExprError:
                ok = False
        if not ok:
            raise _err(file, f"param_defaults.{n}", f"expected one of {list(allowed[n])}, got {value!r}", table, n)
        out.append((n, value))
    return tuple(out)


def parse_spec(doc: Any, file: str) -> Spec:
    """Validate a parsed YAML document and build a :class:`Spec`; raises SpecError."""
    if not isinstance(doc, dict):
        raise _err(file, "<top>", "a spec must be a YAML mapping", doc)
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        k = sorted(map(str, unknown))[0]
        raise _err(file, k, f"unknown key (allowed: {sorted(_TOP_KEYS)})", doc, k)
    for k in ("name", "template", "kernel_name", "params", "tunables", "rules", "launch", "args"):
        if k not in doc:
            raise _err(file, k, "required key is missing", doc)
    for k in ("name", "template", "kernel_name"):
        if not isinstance(doc[k], str) or not doc[k]:
            raise _err(file, k, f"expected a non-empty string, got {doc[k]!r}", doc, k)
    if not doc["kernel_name"].isidentifier():
        raise _err(file, "kernel_name", "must be a C identifier", doc, "kernel_name")
    template = doc["template"]
    params = _values_table(doc, "params", file, required=True)
    tunables = _values_table(doc, "tunables", file, required=True)
    clash = set(dict(params)) & set(dict(tunables))
    if clash:
        raise _err(file, "tunables", f"names used as both param and tunable: {sorted(clash)}", doc, "tunables")
    _check_template(template, params, tunables, file, doc)
    known = set(dict(params)) | set(dict(tunables))
    domains = _param_domains(doc, file, params)
    compared: list = []  # (key, text, node, sub) of the expressions _check_literals reads once the spec is built

    derived_doc = _section(doc, file, "derived", "name -> expression")
    derived = []
    for name, e in derived_doc.items():
        key = f"derived.{name}"
        if not isinstance(name, str) or not name.isidentifier() or name in known:
            raise _err(file, key, "must be a new identifier (not a param or tunable)", derived_doc, name)
        text = _expr_str(e, file, key, derived_doc, name)
        missing = _expr.names_in(text) - known
        if missing:
            raise _err(file, key, f"uses unknown names {sorted(missing)}", derived_doc, name)
        derived.append((name, text))
        known.add(name)
        compared.append((key, text, derived_doc, name))

    facts_doc = doc.get("facts", LineList())
    if not isinstance(facts_doc, list) or not all(isinstance(f, str) and f.isidentifier() for f in facts_doc):
        raise _err(file, "facts", "expected a list of identifiers", doc, "facts")
    facts = tuple(facts_doc)
    if set(facts) & known:
        raise _err(file, "facts", f"fact names clash with params/tunables: {sorted(set(facts) & known)}", doc, "facts")
    batch_fact, from_model = _shapes_keys(doc, file, params, facts)
    module = doc.get("module", "")
    if not isinstance(module, str) or (module and not module.isidentifier()):
        raise _err(file, "module", f"expected the name of a module under gdnjit (e.g. gdn), got {module!r}", doc,
                   "module")
    from_arch = [(name, text) for name, text, _ in _param_expressions(
        doc, file, params, "from_arch", "param -> expression over arch", lambda name: "arch")]
    dispatch_params = _dispatch_params(doc, file, params)
    compared += [(f"dispatch_params.{n}", text, doc["dispatch_params"], n) for n, text in dispatch_params]
    invariant_batch = doc.get("invariant_batch", 0)
    if isinstance(invariant_batch, bool) or not isinstance(invariant_batch, int) or invariant_batch < 0 or \
            (invariant_batch and not batch_fact):
        raise _err(file, "invariant_batch", f"expected a positive int (with a batch fact), got {invariant_batch!r}",
                   doc, "invariant_batch")
    checks_doc = doc.get("model_checks", LineList())
    if not isinstance(checks_doc, list):
        raise _err(file, "model_checks", "expected a list of {expr, why}", doc, "model_checks")
    model_checks = []
    for i, c in enumerate(checks_doc):
        if not isinstance(c, dict) or set(c) - {"expr", "why"} or "expr" not in c:
            raise _err(file, f"model_checks[{i}]", "expected a mapping with expr (and why)", checks_doc, i)
        text = _expr_str(c["expr"], file, f"model_checks[{i}].expr", c, "expr")
        model_checks.append(Constraint(text, str(c.get("why", "")), _line(checks_doc, i)))

    constraints = []
    cons_doc = doc.get("constraints", LineList())
    if not isinstance(cons_doc, list):
        raise _err(file, "constraints", "expected a list of {expr, why}", doc, "constraints")
    for i, c in enumerate(cons_doc):
        key = f"constraints[{i}]"
        if not isinstance(c, dict) or set(c) - {"expr", "why"} or "expr" not in c:
            raise _err(file, key, "expected a mapping with keys expr (and why)", cons_doc, i)
        text = _expr_str(c["expr"], file, key + ".expr", c, "expr")
        missing = _expr.names_in(text) - known
        if missing:
            raise _err(file, key, f"uses unknown names {sorted(missing)}", cons_doc, i)
        constraints.append(Constraint(text, str(c.get("why", "")), _line(cons_doc, i)))
        compared.append((key + ".expr", text, c, "expr"))

    rules_doc = doc["rules"]
    if not isinstance(rules_doc, list) or not rules_doc:
        raise _err(file, "rules", "expected a non-empty list of rules", doc, "rules")
    tunable_names = [n for n, _ in tunables]
    rules = []
    for i, r in enumerate(rules_doc):
        key = f"rules[{i}]"
        if not isinstance(r, dict) or set(r) - {"when", "use", "why"} or "use" not in r:
            raise _err(file, key, "expected a mapping with keys use (and when, why)", rules_doc, i)
        use = r["use"]
        if not isinstance(use, dict) or set(use) != set(tunable_names):
            raise _err(file, key + ".use", f"must set exactly the tunables {tunable_names}", r, "use")
        for n, v in use.items():
            if v not in dict(tunables)[n]:
                raise _err(file, f"{key}.use.{n}", f"{v!r} is not an allowed value {list(dict(tunables)[n])}", use, n)
        when = None
        if r.get("when") is not None:
            when = _expr_str(r["when"], file, key + ".when", r, "when")
            missing = _expr.names_in(when) - known - set(facts)
            if missing:
                raise _err(file, key + ".when", f"uses unknown names {sorted(missing)}", r, "when")
            compared.append((key + ".when", when, r, "when"))
        rules.append(Rule(when, tuple((n, use[n]) for n in tunable_names), str(r.get("why", "")), _line(rules_doc, i)))

    retile_may_set, retile = _retile(doc, file, tunables, set(dict(params)) | set(tunable_names) | set(facts))
    compared += [(f"retile[{i}].when", r.when, doc["retile"][i], "when") for i, r in enumerate(retile)]
    first_launch = _first_launch(doc, file, params, tunables)
    if first_launch is not None:
        compared.append(("first_launch.when", first_launch.when, doc["first_launch"], "when"))

    launch_doc = doc["launch"]
    if not isinstance(launch_doc, dict) or set(launch_doc) != {"grid", "block", "smem"}:
        raise _err(file, "launch", "expected a mapping with exactly grid, block, smem", doc, "launch")
    launch = []
    for n in ("grid", "block", "smem"):
        text = _expr_str(launch_doc[n], file, f"launch.{n}", launch_doc, n)
        missing = _expr.names_in(text) - known - set(facts)
        if missing:
            raise _err(file, f"launch.{n}", f"uses unknown names {sorted(missing)}", launch_doc, n)
        launch.append((n, text))
        compared.append((f"launch.{n}", text, launch_doc, n))

    args, arg_defaults = _args(doc, file)
    param_defaults = _param_defaults(doc, file, params, domains)

    spec = Spec(
        name=doc["name"], description=str(doc.get("description", "")), template=template,
        kernel_name=doc["kernel_name"], params=params, tunables=tunables, derived=tuple(derived),
        constraints=tuple(constraints), facts=facts, rules=tuple(rules), launch=tuple(launch),
        args=args, arg_defaults=arg_defaults, param_defaults=param_defaults, file=file, domains=domains, batch_fact=batch_fact, from_model=from_model,
        model_checks=tuple(model_checks), from_arch=tuple(from_arch), module=module,
        dispatch_params=dispatch_params, invariant_batch=invariant_batch, retile_may_set=retile_may_set,
        retile=retile, first_launch=first_launch,
    )
    for place in compared:
        _check_literals(spec, *place)
    _check_fallbacks(spec, doc)
    return spec


def _check_literals(spec: Spec, key: str, text: str, node: Any, sub: Any) -> None:
    """SpecError if ``text`` compares a param or tunable with a literal it never takes (``acc_dtype == 'nnone'``,
    ``K in (64, 96)``): such a test never holds (or, negated, always does), most likely a typo. A param with a domain
    takes every integer the domain accepts; facts and derived values have no list to check."""
    names = set(spec.param_names) | set(spec.tunable_names)
    source, comparisons = _literal_comparisons(text)
    for cmp, name, values in comparisons:
        if name not in names:
            continue
        # 60.0 and True equal the integers 60 and 1, which a domain may take
        bad = [v for v in values if not spec.accepts(name, int(v) if isinstance(v, bool) or (
            isinstance(v, float) and v.is_integer()) else v)]
        if bad:
            shown = " ".join(ast.get_source_segment(source, cmp).split())
            raise _err(spec.file, key, f"`{shown}` compares {name} with {bad[0]!r}, a value it never takes "
                       f"(allowed: {spec.allowed_text(name)})", node, sub)


@functools.lru_cache(maxsize=4096)
def _literal_comparisons(text: str) -> tuple[str, tuple]:
    """(the source parsed, ((comparison node, name, literal values), ...)) for each ``name == literal`` / ``!=``
    (either side) and ``name in (literals)`` / ``not in`` (a tuple or list) in ``text`` read as Python, chained
    comparisons pair by pair; none for a text Python does not parse (Jinja's own syntax)."""
    source = f"(\n{text.strip()}\n)"  # in parentheses: a text may span lines, as Jinja allows
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source, ()
    out = []
    for cmp in ast.walk(tree):
        if not isinstance(cmp, ast.Compare):
            continue
        operands = [cmp.left, *cmp.comparators]
        for left, op, right in zip(operands, cmp.ops, operands[1:]):
            member = isinstance(op, (ast.In, ast.NotIn))
            if not (member or isinstance(op, (ast.Eq, ast.NotEq))):
                continue  # orderings (<, >) are not read
            # `'bf' in name` tests the value's contents: only `name in (...)` is read
            for name, literal in [(left, right)] if member else [(left, right), (right, left)]:
                if not isinstance(name, ast.Name):
                    continue
                try:
                    value = ast.literal_eval(literal)
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                    continue  # not a literal
                if not member:
                    out.append((cmp, name.id, (value,)))
                elif isinstance(value, (tuple, list)):
                    out.append((cmp, name.id, tuple(value)))
    return source, tuple(out)


def _tunables_alone(spec: Spec, rule: Rule) -> dict[str, Any]:
    """``rule``'s tunables and the derived values they alone decide (params undefined)."""
    ctx = dict(rule.use)
    for n, e in spec.derived:
        try:
            ctx[n] = _expr.evaluate(e, ctx)
        except _expr.ExprError:
            pass
    return ctx


def _satisfied_by_tunables(c: Constraint, contexts: list[dict[str, Any]]) -> bool:
    """Whether ``c`` holds for every rule from the rule's tunables alone (``contexts``: _tunables_alone of
    each rule; an expression that reads a param is not decided here)."""
    for ctx in contexts:
        try:
            if not _expr.evaluate(c.expr, ctx):
                return False
        except _expr.ExprError:
            return False
    return True


_MAX_FALLBACK_COMBOS = 4096


def _fails_on_tunables(spec: Spec, rule: Rule) -> bool:
    """Whether a derived value that reads only ``rule``'s tunables (and such derived values) fails to evaluate: then
    no params make the rule valid."""
    ctx = dict(rule.use)
    for n, e in spec.derived:
        if _expr.names_in(e) <= ctx.keys():
            try:
                ctx[n] = _expr.evaluate(e, ctx)
            except _expr.ExprError:
                return True
    return False


class _Traced(_LazyValues):
    """_LazyValues that remembers the first derived value that failed to evaluate: the innermost one (a derived
    value that reads a failing one fails with its error)."""

    failed: tuple[str, _expr.ExprError] | None = None

    def __getitem__(self, name: str) -> Any:
        try:
            return super().__getitem__(name)
        except _expr.ExprError as e:
            if self.failed is None:
                self.failed = (name, e)
            raise

    def shown(self, text: str) -> str:
        """`` (n=1, t=2)``: the values computed so far of the names ``text`` reads ("" if none)."""
        read = [f"{n}={self._values[n]!r}" for n in sorted(_expr.names_in(text)) if n in self._values]
        return f" ({', '.join(read)})" if read else ""


def _evaluation_error(spec: Spec, doc: Any, params: dict[str, Any], index: int) -> SpecError | None:
    """The SpecError naming the derived value (or constraint) that fails to evaluate for ``params`` and rule
    ``index``'s tunables where no constraint is false (a derived value may fail where the constraints exclude the
    combination, in whatever order they come); None where one is false or everything evaluates."""
    values = _Traced(spec, tuple(params.items()), spec.rules[index].use)
    where = f"with rules[{index}]'s tunables"
    broken = None  # (index, error, whether no derived value failed) of the first constraint that fails to evaluate
    for i, c in enumerate(spec.constraints):
        try:
            if not _expr.evaluate(c.expr, values):
                return None
        except _expr.ExprError as e:
            broken = broken or (i, e, values.failed is None)
    if broken is None:
        for n in values:  # every derived value must evaluate, as in Spec.valid
            try:
                values[n]
            except _expr.ExprError:
                break
    elif broken[2]:  # the constraint's own expression
        i, e, _ = broken
        text = spec.constraints[i].expr
        return _err(spec.file, f"constraints[{i}].expr", f"fails to evaluate {where}{values.shown(text)}: {e}",
                    doc["constraints"][i], "expr")
    if values.failed is None:
        return None
    name, e = values.failed
    shown = values.shown(dict(spec.derived)[name])
    return _err(spec.file, f"derived.{name}", f"fails to evaluate {where} where the constraints hold{shown}: {e}",
                doc["derived"], name)


def _check_fallbacks(spec: Spec, doc: Any) -> None:
    """Every combination of the params the constraints read must have a valid rule without ``when``,
    so dispatch can never come up empty; a derived value must not fail where the constraints hold."""
    rules_doc = doc["rules"]
    fallbacks = [r for r in spec.rules if r.when is None]
    if not fallbacks:
        raise _err(spec.file, "rules", "needs at least one rule without `when` (the fallback)", rules_doc)
    # Only params the constraints read, directly or through derived values, change validity; a
    # derived value no constraint reads (e.g. a launch-bounds hint) would only multiply the combinations.
    # A constraint that the fallbacks' tunables alone satisfy (e.g. "form != 'tc' or ...": the `or`
    # never reads the params) changes nothing either, so its params are not enumerated.
    derived = dict(spec.derived)
    used: set[str] = set()
    alone = [_tunables_alone(spec, r) for r in fallbacks] if spec.constraints else []
    todo = [n for c in spec.constraints if not _satisfied_by_tunables(c, alone) for n in _expr.names_in(c.expr)]
    while todo:
        n = todo.pop()
        if n not in used:
            used.add(n)
            if n in derived:
                todo.extend(_expr.names_in(derived[n]))
    pnames = [n for n, _ in spec.params if n in used]
    pvals = [dict(spec.params)[n] for n in pnames]
    count = math.prod(len(v) for v in pvals)
    if count > _MAX_FALLBACK_COMBOS:  # the shipped specs enumerate 18-36; millions would hang the loader
        raise _err(spec.file, "rules", f"checking the fallback rules would enumerate {count} combinations of the params "
                   f"{', '.join(pnames)} (at most {_MAX_FALLBACK_COMBOS}): let the fallbacks' tunables alone satisfy "
                   f"more constraints", rules_doc)
    defaults = {n: v[0] for n, v in spec.params}
    combos = [dict(defaults, **dict(zip(pnames, combo))) for combo in itertools.product(*pvals)]
    # A rule (with `when` too: dispatch would skip it silently) whose tunables alone make a derived value fail is
    # never valid: an error unless the constraints exclude it
    suspects = [i for i, r in enumerate(spec.rules) if _fails_on_tunables(spec, r)]
    error = next(filter(None, (_evaluation_error(spec, doc, p, i) for i in suspects for p in combos)), None)
    if error:
        raise error
    for params in combos:
        if not any(spec.valid(params, dict(r.use)) for r in fallbacks):
            # a derived value failing there says more than "no fallback"
            error = next(filter(None, (_evaluation_error(spec, doc, params, i)
                                       for i, r in enumerate(spec.rules) if r.when is None)), None)
            if error:
                raise error
            shown = ", ".join(f"{n}={params[n]!r}" for n in pnames)
            raise _err(spec.file, "rules", f"no fallback rule (without `when`) is valid for {shown}", rules_doc)


def load_spec_file(path: str | Path) -> Spec:
    """Load and validate one spec YAML file; raises SpecError naming file, line and key."""
    from .yamlio import read_yaml_file  # only here: a recorded spec needs no YAML library (spec_record)

    path = Path(path)
    shipped = path.parent == SPEC_DIR  # read with libyaml (yamlio.load_yaml)
    return parse_spec(read_yaml_file(path, fast=shipped), path.name if shipped else str(path))


@functools.lru_cache(maxsize=None)
def get_spec(name: str) -> Spec:
    """The shipped spec called ``name`` (file ``gdnjit/specs/<name>.yaml``)."""
    if not isinstance(name, str) or name not in list_specs():  # also blocks paths and absurd names
        raise ValueError(f"spec name: no shipped spec {name!r}; available: {list_specs()}")
    path = SPEC_DIR / f"{name}.yaml"
    spec = recorded_spec(path.name, path.read_bytes()) or load_spec_file(path)
    if spec.name != name:
        raise SpecError(path.name, "name", f"must equal the file name {name!r}, got {spec.name!r}")
    return spec


def recorded_spec(file_name: str, yaml_bytes: bytes) -> Spec | None:
    """The validated Spec recorded for exactly these bytes of shipped file ``file_name`` (``specs/validated.json``,
    :mod:`gdnjit.spec_record`), or None: a shipped spec loads in ~2 ms without parsing."""
    from . import spec_record

    record = spec_record.lookup(file_name, yaml_bytes)
    return None if record is None else spec_record.decode(record, {"Spec": Spec, "Rule": Rule, "Constraint": Constraint,
                                                                     "FirstLaunch": FirstLaunch})


def list_specs() -> list[str]:
    """Names of the shipped specs."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
