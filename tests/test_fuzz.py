"""Fuzzing (hypothesis) of everything that takes user input before a kernel exists:

(a) the spec loader (``parse_spec`` on mutated copies of the shipped ``gdn.yaml``),
(b) the shapes loader (``load_shapes`` on mutated copies of ``qwen35.yaml``),
(c) the GDN API argument checks (the public functions, with ``prepare(require_cuda=False)`` so CPU
    tensors reach every check), against an independent oracle of the documented rules
    (docs/api.md): invalid input raises TypeError/ValueError naming an offending argument and never
    reaches dispatch or a launch; valid input reaches dispatch.

Loader failures must be a SpecError naming the file and a key — never another exception type.
Inputs that hit the known bugs listed in ``KNOWN_BUGS`` are filtered out of the fuzzers and
pinned by the regression tests at the end (all of them are fixed now).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
import jinja2
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import gdnjit
from gdnjit import dispatch, gdn, runner
from gdnjit.errors import SpecError
from gdnjit.launch import Launcher
from gdnjit.lazy import prepare_step
from gdnjit.shapes import SHAPES_DIR, load_shapes, params_for
from gdnjit.spec import SPEC_DIR, get_spec, parse_spec
from gdnjit.yamlio import LineDict, LineList, load_yaml, read_yaml_file

try:
    import numpy as np
except ImportError:  # optional (torch does not require it)
    np = None

# 300 examples a test in the full test tier (GDNJIT_TEST_FULL=1, tests/conftest.py), 50 in the default one;
# GDNJIT_TEST_FUZZ_EXAMPLES=5000 for a longer hunt.
FULL_TIER = os.environ.get("GDNJIT_TEST_FULL", "").strip() not in ("", "0")
FUZZ = settings(
    max_examples=int(os.environ.get("GDNJIT_TEST_FUZZ_EXAMPLES", "300" if FULL_TIER else "50")), deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def _jinja_env():
    """The sandboxed Jinja environment of spec expressions (gdnjit.expr_jinja, imported on first need)."""
    from gdnjit.expr_jinja import ENV

    return ENV


# ---- shared: documents and their mutation --------------------------------------------------------


def plain(x: Any) -> Any:
    """LineDict/LineList -> plain dict/list (deep)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


GDN_DOC = plain(read_yaml_file(SPEC_DIR / "gdn.yaml", fast=True))  # libyaml: gdnjit's own files (collection time)
SHAPES_DOC = plain(read_yaml_file(SHAPES_DIR / "qwen35.yaml", fast=True))

EXPRESSIONS = [
    # well-formed, referring to real names, fact names, unknown names, and builtins
    "K // lanes_per_row", "T > 1 and layout == 'klast'", "B * HV", "num_warps * 32", "vec", "0", "1",
    "min(K, V)", "max(1, 2)", "abs(-3)", "int('7')", "len(layout)", "undefined_name", "B", "num_sms",
    # syntax errors, template syntax, attribute and subscript tricks, division by zero, sandbox escapes
    "K //", "(", ")", "{{ K }}", "{% if %}", "K +* 2", "lanes_per_row and", "'unterminated",
    "x.__class__", "().__class__.__bases__", "K|attr('__class__')", "1/0", "K // 0", "K % 0",
    "[1, 2][5]", "{'a': 1}['b']", "none.x", "K is divisibleby 0", "int('x')", "len(1)", "max()",
    "range(10 ** 9)", "[].append(1)", "{}.pop('x')", "'%d' % 'x'", "lipsum()", "cycler(1, 2)",
    "namespace(a=1)", "K.bit_length()", "(1, 2).index(3)", "1e400", "int(1e400)", "-", "not",
    "K if T else", "layout == klast", "[K, V]", "{'K': K}", "K ~ V", "true", "None", "none",
    "\\", "\n", "   ", "", "é", "K\x00",
]
NAMES = ["B", "H", "HV", "K", "V", "T", "num_sms", "layout", "lanes_per_row", "ilp", "tile_v", "stage", "vec",
         "gdn", "gdn.cu.j2", "gdn_step", "klast", "kmajor", "bf16", "fp32", "int32", "none", "ptr", "i64",
         "f32", "i32", "qwen35", "decode", "when", "use", "why", "expr", "grid", "block", "smem", "calls",
         "params", "models", "tp", "batch_sizes", "defaults", "spec", "name", "H-V", "1abc", "_", "__init__"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([0, 1, -1, 2, 16, 64, 96, 128, 256, 512, 100000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(EXPRESSIONS),
    st.sampled_from(NAMES),
)
keys = st.one_of(st.sampled_from(NAMES), st.text(max_size=8), st.integers(-3, 300), st.booleans())
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=8,
)


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node below the root."""
    out = []
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        return out
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,))
    return out


def node(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated(draw, base: dict) -> tuple[dict, list[str]]:
    """A deep copy of ``base`` with 1-4 random mutations (drop, replace, add key, add item, wrap);
    returns (doc, descriptions)."""
    doc = copy.deepcopy(base)
    done = []
    for _ in range(draw(st.integers(1, 4))):
        all_paths = paths(doc)
        op = draw(st.sampled_from(["drop", "replace", "replace", "add_key", "add_item", "wrap", "top"]))
        if op == "top":  # replace the whole document
            doc = draw(values)
            done.append(f"document := {doc!r}")
            if not isinstance(doc, dict):
                break
            continue
        if not all_paths:
            break
        path = draw(st.sampled_from(all_paths))
        parent, last = node(doc, path[:-1]), path[-1]
        if op == "drop":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(values)
        elif op == "wrap":  # a correct value in the wrong container
            parent[last] = draw(st.sampled_from([[parent[last]], {"value": parent[last]}, str(parent[last])]))
        elif op == "add_key":
            target = parent if isinstance(parent, dict) else parent[last] if isinstance(parent[last], dict) else None
            if target is None:
                continue
            target[draw(keys)] = draw(values)
        elif op == "add_item":
            target = parent if isinstance(parent, list) else parent[last] if isinstance(parent[last], list) else None
            if target is None:
                continue
            target.append(draw(values))
        done.append(f"{op} {path!r}")
    return doc, done


def lined(x: Any) -> Any:
    """Plain dict/list -> LineDict/LineList without line numbers (what the loader gives, minus lines).
    Plain dicts are not accepted by ``parse_spec``: KNOWN_BUGS spec-1."""
    if isinstance(x, dict):
        out = LineDict((k, lined(v)) for k, v in x.items())
        out.key_lines = {}
        return out
    if isinstance(x, list):
        out = LineList(lined(v) for v in x)
        out.item_lines = []
        return out
    return x


def to_yaml(doc: Any) -> str | None:
    """The document as YAML text (None if PyYAML cannot represent it)."""
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return None


def check_spec_error(e: SpecError, file: str, doc: Any, allowed_roots: set[str]) -> None:
    """A loader error names the file and a key (of the document, or a pseudo key for the whole file)."""
    msg = str(e)
    assert isinstance(e, SpecError), type(e)
    assert e.file == file and msg.startswith(file), msg
    doc_keys = {str(k) for k in doc} if isinstance(doc, dict) else set()
    assert isinstance(e.key, str) and (e.key or "" in doc_keys), msg  # "" only when the bad key is ""
    assert f": {e.key}: " in msg, msg
    assert e.reason and isinstance(e.reason, str), msg
    root = re.split(r"[.\[]", e.key, maxsplit=1)[0]
    assert e.key in doc_keys or root in allowed_roots | doc_keys | {"<top>", "<yaml>", "<file>"}, (root, msg)


def _root_label(key: str, roots: set[str]) -> str:
    root = re.split(r"[.\[]", key, maxsplit=1)[0]
    return root if root in roots | {"<top>", "<yaml>", "<file>"} else "an unknown key"


# ---- (a) specs ----------------------------------------------------------------------------------

SPEC_FILE = "fuzzed-gdn.yaml"
SPEC_ROOTS = set(GDN_DOC) | {"constraints", "derived", "facts", "description"}


def spec_roundtrip_ok(spec) -> None:
    """A spec that loads must dispatch: every fallback promise holds for its first param values."""
    params = {n: vals[0] for n, vals in spec.params}
    facts = {f: 1 for f in spec.facts}
    try:
        tunables, rule = dispatch.select(spec, params, facts)
    except dispatch.DispatchError as e:  # validation promises a valid fallback: this must never happen
        raise AssertionError(f"spec loaded but cannot dispatch: {e}") from None
    except ValueError:  # a `when` that fails to evaluate over these facts (not checkable at load time)
        return
    assert spec.violations(params, tunables) == []


@FUZZ
@given(mutated(GDN_DOC), st.booleans())
def test_fuzz_spec_loader(case, through_yaml):
    doc, what = case
    if through_yaml:  # with line numbers, through the real YAML loader
        text = to_yaml(doc)
        assume(text is not None)
        try:
            doc = load_yaml(text, SPEC_FILE)
        except SpecError as e:
            check_spec_error(e, SPEC_FILE, doc, SPEC_ROOTS)
            return
    else:  # the document as built (any value YAML could not even represent), without line numbers
        doc = lined(doc)
    try:
        spec = parse_spec(doc, SPEC_FILE)
    except SpecError as e:
        check_spec_error(e, SPEC_FILE, doc, SPEC_ROOTS)
        if through_yaml and e.line is not None:
            assert 1 <= e.line <= text.count("\n") + 1
        event(f"SpecError at {_root_label(e.key, SPEC_ROOTS)}")
        return
    event("loaded")
    spec_roundtrip_ok(spec)


def test_the_unmutated_documents_load():
    parse_spec(lined(GDN_DOC), SPEC_FILE)
    parse_spec(load_yaml(to_yaml(GDN_DOC), SPEC_FILE), SPEC_FILE)
    assert load_shapes(SHAPES_DIR / "qwen35.yaml")


# ---- (a2) expressions: the load-time check refuses exactly what compiling refuses ----------------
# Loading a spec checks each expression with expr.check_expr (a parse; a compile only where the parse cannot
# decide) and compiles it at its first evaluation. A text check_expr passes that compile_expr refuses would
# be a spec error found late: random expressions, well-formed and broken, must get the same verdict.

_EXPR_LEAVES = st.sampled_from(["K", "B", "x", "self", "loop", "min", "caller", "é", "0", "1", "-1", "2.5", "1e400",
                                "'a'", '"b"', "true", "none", "9" * 25, "1_000", "lipsum", "namespace"])


def _combine(sub):
    op = st.sampled_from
    return st.one_of(
        st.tuples(sub, op(["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">=", "in", "not in", "and",
                           "or"]), sub).map(" ".join),
        st.tuples(op(["not ", "-", "+", "("]), sub).map(lambda t: t[0] + t[1] + (")" if t[0] == "(" else "")),
        st.tuples(sub, sub, st.none() | sub).map(lambda t: f"{t[0]} if {t[1]}" + (f" else {t[2]}" if t[2] else "")),
        st.tuples(op(["min", "max", "int", "x", "x.y", "len"]), st.lists(sub, max_size=3),
                  st.sampled_from(["", ", a=1", ", if=1", ", a=1, a=2", ", *x", ", **x"])).map(
            lambda t: f"{t[0]}({', '.join(t[1])}{t[2] if t[1] else t[2][2:]})"),
        st.tuples(sub, op(["int", "abs", "nofilter", "default(1)", "length", "attr('x')"])).map(" | ".join),
        st.tuples(sub, op(["defined", "nosuchtest", "divisibleby 3", "none"])).map(" is ".join),
        st.lists(sub, max_size=3).map(lambda xs: f"[{', '.join(xs)}]"),
        st.lists(sub, min_size=1, max_size=3).map(lambda xs: f"({', '.join(xs)},)"),
        st.tuples(sub, sub).map(lambda t: f"{{{t[0]}: {t[1]}}}"),
        st.tuples(sub, op(["x", "__class__", "if", "upper"])).map(".".join),
        st.tuples(sub, sub, st.booleans()).map(lambda t: f"{t[0]}[{t[1]}]" if t[2] else f"{t[0]}[{t[1]}:]"),
    )


expressions = st.recursive(_EXPR_LEAVES, _combine, max_leaves=12)


@st.composite
def expression_texts(draw):
    """A random expression, or one broken by a dropped, inserted or cut token."""
    text = draw(expressions)
    if draw(st.booleans()):
        return text
    toks = text.split(" ")
    i = draw(st.integers(0, len(toks) - 1))
    how = draw(st.sampled_from(["drop", "insert", "cut"]))
    if how == "drop" and len(toks) > 1:
        del toks[i]
    elif how == "insert":
        toks.insert(i, draw(st.sampled_from(["(", ")", ",", "|", "and", "if", "=", "]", "}}", "{%", "is"])))
    else:
        toks[i] = toks[i][:-1]
    return " ".join(toks)


def _expr_outcome(fn, text):
    fn.cache_clear()
    try:
        return "ok", fn(text)
    except Exception as e:  # noqa: BLE001 - the same exception, whatever it is
        return type(e).__name__, str(e)


@FUZZ
@given(expression_texts())
def test_fuzz_check_expr_agrees_with_compile_expr(text):
    import warnings

    import jinja2.meta

    from gdnjit import expr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # Python's compile warns on e.g. 1[0]
        checked, compiled = _expr_outcome(expr.check_expr, text), _expr_outcome(expr.compile_expr, text)
    assert checked[0] == compiled[0], (text, checked, compiled)
    event(f"check_expr: {checked[0]}")
    if checked[0] != "ok":
        assert checked == compiled, text
        return
    ast = _jinja_env().parse("{{ " + text + " }}")
    assert checked[1] == set(jinja2.meta.find_undeclared_variables(ast)) - set(_jinja_env().globals), text


_FAST_CONTEXTS = ({"K": 3, "B": 5, "x": 2, "é": -1, "y": 1.5}, {"K": 0, "B": "a", "x": (1, 2)}, {"K": 7})


@FUZZ
@given(expressions)
def test_fuzz_the_python_fast_path_evaluates_as_jinja(text):
    """A text in the common subset (expr._fast) gives Jinja's value, or Jinja's exception, in every context; where
    a free name is missing it raises (Jinja may instead return Undefined, also nested in a list)."""
    import warnings

    from gdnjit import expr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        fast = expr._fast(text)
        if fast is None:
            event("left to Jinja")
            return
        event("fast path")
        jinja = _jinja_env().compile_expression(text, undefined_to_none=False)
        for ctx in _FAST_CONTEXTS:
            outcomes = []
            for fn in (jinja, expr._FastExpr(*fast)):
                try:
                    value = fn(**ctx)
                    # a bare undefined name: Jinja returns Undefined (expr._evaluate refuses it), Python raises
                    outcomes.append(("undefined", "") if isinstance(value, jinja2.Undefined) else ("ok", value))
                except (jinja2.UndefinedError, expr.UndefinedName):
                    outcomes.append(("undefined", ""))
                except Exception as e:  # noqa: BLE001 - the same exception type, whatever it is
                    outcomes.append((type(e).__name__, ""))
            a, b = outcomes
            if b[0] == "undefined":  # stricter than Jinja, which may carry Undefined inside a list or len([x])
                assert not fast[1] <= set(ctx), (text, ctx, a, b)
                continue
            same = a == b or (a[0] == b[0] == "ok" and isinstance(a[1], float) and a[1] != a[1] and b[1] != b[1])
            assert same and type(a[1]) is type(b[1]), (text, ctx, a, b)


# ---- (b) shapes ---------------------------------------------------------------------------------

SHAPES_ROOTS = set(SHAPES_DOC)
_tmp = tempfile.TemporaryDirectory(prefix="gdnjit-fuzz-")


def known_shapes_bug(doc: Any) -> bool:
    """Inputs that hit KNOWN_BUGS shapes-1/shapes-2 (excluded from the fuzzer; pinned by xfail tests)."""
    calls = doc.get("calls") if isinstance(doc, dict) else None
    if not isinstance(calls, list):
        return False
    for call in calls:
        if not isinstance(call, dict):
            continue
        p = call.get("params")
        if p and not isinstance(p, dict):
            return True  # shapes-1
        if "spec" in call and len(str(call["spec"]).encode()) > 200:
            return True  # shapes-2
    return False


@FUZZ
@given(mutated(SHAPES_DOC), st.integers(0, 10 ** 9))
def test_fuzz_shapes_loader(case, n):
    doc, what = case
    # (shapes-1 and shapes-2 are fixed: no inputs are excluded any more)
    text = to_yaml(doc)
    assume(text is not None)
    path = Path(_tmp.name) / f"shapes-{n}.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        problems = load_shapes(path)
    except SpecError as e:
        check_spec_error(e, str(path), doc, SHAPES_ROOTS)
        event(f"SpecError at {_root_label(e.key, SHAPES_ROOTS)}")
        return
    finally:
        path.unlink(missing_ok=True)
    event("loaded")
    for p in problems:  # what loads is usable: valid params for every arch, positive facts
        spec = get_spec(p.spec)
        for arch in ("sm_90", "sm_100a"):
            spec.check_params(params_for(p, arch))
        facts = dict(p.facts)
        assert all(isinstance(v, int) and v >= 1 for v in facts.values()) and p.tp >= 1
        if p.spec == "gdn":
            assert facts["HV"] % facts["H"] == 0
        assert p.batch_sizes and all(isinstance(b, int) and b > 0 for b in p.batch_sizes)


# ---- (c) GDN argument checks --------------------------------------------------------------------

ARG_NAMES = {
    "q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale", "output", "use_qk_l2norm", "initial_state",
    "initial_state_indices", "output_state_indices", "intermediate_states_buffer", "ssm_state_indices",
    "disable_state_update",
}
IN_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DTB_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IDX_DTYPES = (torch.int32, torch.int64)
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8,
              torch.uint8, torch.bool, torch.complex64]
NON_TENSORS = [0, 1.5, "q", [1, 2], (), {}, object()]
SCALES = [None, 0.5, 1, 0, -1.0, 1e30, float("nan"), float("inf"), True, False, "0.1", [0.1], torch.tensor(0.5)]
FLAGS = [True, False, 1, 0, None, "yes"]
if np is not None:  # numpy look-alikes: an array is not a tensor, np.float64 is a float, np.float32/np.bool_ are not
    NON_TENSORS.append(np.zeros(4, dtype=np.float32))
    SCALES += [np.float64(0.3), np.float32(0.3)]
    FLAGS.append(np.bool_(True))


class Reached(Exception):
    """Raised by the monkeypatched dispatch/launch: the call got past validation."""


@st.composite
def gdn_case(draw):
    """(function name, kwargs, mutations) for one public GDN call, valid before the mutations."""
    fn = draw(st.sampled_from(["pretranspose", "mtp", "decode"]))
    B = draw(st.sampled_from([0, 1, 2, 3]))
    T = 1 if fn == "pretranspose" and draw(st.booleans()) else draw(st.sampled_from([1, 2, 3, 16]))
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2]))
    K, V = draw(st.sampled_from([64, 128, 256])), draw(st.sampled_from([64, 128]))
    dt = draw(st.sampled_from(IN_DTYPES))
    sdt = draw(st.sampled_from(STATE_DTYPES))
    klast = fn != "decode"
    pool_mode = fn == "mtp" or (fn == "pretranspose" and draw(st.booleans()))
    P = B + draw(st.sampled_from([0, 1, 3])) if pool_mode else B
    slot = (HV, V, K) if klast else (HV, K, V)
    e = torch.empty
    args: dict[str, Any] = dict(
        q=e(B, T, H, K, dtype=dt), k=e(B, T, H, K, dtype=dt), v=e(B, T, HV, V, dtype=dt),
        A_log=e(HV), a=e(B, T, HV, dtype=dt), dt_bias=e(HV, dtype=draw(st.sampled_from(DTB_DTYPES))),
        b=e(B, T, HV, dtype=dt),
    )
    if draw(st.booleans()):
        args["scale"] = draw(st.sampled_from([0.1, 1.0, 2]))
    if draw(st.booleans()):
        args["output"] = e(B, T, HV, V, dtype=draw(st.sampled_from(OUT_DTYPES)))
    args["use_qk_l2norm"] = draw(st.booleans())
    if pool_mode:
        idt = draw(st.sampled_from(IDX_DTYPES))
        args["initial_state"] = e(P, *slot, dtype=sdt)
        args["initial_state_indices"] = torch.zeros(B, dtype=idt)
        if fn == "pretranspose":
            args["state"] = args["initial_state"] if draw(st.booleans()) else None
        extra = draw(st.sampled_from(["none", "none", "write", "inter", "ssm"] if fn == "mtp" else ["none", "write"]))
        if fn == "mtp":
            args["disable_state_update"] = extra == "inter" and draw(st.booleans())
        if extra == "write":
            args["output_state_indices"] = torch.zeros(B, dtype=idt)
        elif extra == "inter":
            args["intermediate_states_buffer"] = e(B + draw(st.sampled_from([0, 2])), T, *slot, dtype=sdt)
        elif extra == "ssm":
            args["ssm_state_indices"] = torch.zeros(B, T, dtype=draw(st.sampled_from(IDX_DTYPES)))
    else:
        args["state"] = e(B, *slot, dtype=sdt)

    optional = {"pretranspose": ["state", "scale", "output", "initial_state", "initial_state_indices",
                                 "output_state_indices"],
                "mtp": ["scale", "output", "intermediate_states_buffer", "ssm_state_indices", "output_state_indices"],
                "decode": ["scale", "output"]}[fn]
    mutations = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(set(args) | set(optional))))
        args[name], how = draw(mutation(name, args.get(name)))
        mutations.append(f"{name}: {how}")
    return fn, args, mutations


@st.composite
def mutation(draw, name: str, x: Any):
    """A replacement for argument ``name`` (currently ``x``) and a description."""
    if name == "scale":
        s = draw(st.sampled_from(SCALES))
        return s, f"scale={s!r}"
    if name in ("use_qk_l2norm", "disable_state_update"):
        f = draw(st.sampled_from(FLAGS))
        return f, f"{f!r}"
    kind = draw(st.sampled_from(["none", "nontensor", "dtype", "shape", "ndim", "noncontig", "pad", "misalign",
                                 "expand", "meta", "zero_dim"]))
    if kind == "none" or not isinstance(x, torch.Tensor) and kind != "nontensor":
        return None, "None"
    if kind == "nontensor":
        return (nt := draw(st.sampled_from(NON_TENSORS))), f"non-tensor {type(nt).__name__}"
    shape, dtype = list(x.shape), x.dtype
    if kind == "dtype":
        d = draw(st.sampled_from(ALL_DTYPES))
        return torch.zeros(shape, dtype=d), f"dtype {d}"
    if kind in ("shape", "zero_dim"):
        i = draw(st.integers(0, len(shape) - 1))
        shape[i] = 0 if kind == "zero_dim" else draw(st.sampled_from([1, 2, 3, 5, 96, max(shape[i] - 1, 0),
                                                                       shape[i] + 1, 2 * shape[i]]))
        return torch.zeros(shape, dtype=dtype), f"shape {shape}"
    if kind == "ndim":
        new = shape[:-1] if draw(st.booleans()) and len(shape) > 1 else shape + [1]
        return torch.zeros(new, dtype=dtype), f"shape {new}"
    if kind == "noncontig":  # same shape, last two dims transposed in memory (or a step-2 1-D view)
        if len(shape) == 1:
            return torch.zeros(2 * shape[0], dtype=dtype)[::2], "step 2"
        return torch.zeros(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2), "transposed"
    if kind == "pad":  # rows padded by p elements: every stride but the last grows
        p = draw(st.sampled_from([1, 8, 64]))
        return torch.zeros(*shape[:-1], shape[-1] + p, dtype=dtype)[..., : shape[-1]], f"row padding {p}"
    if kind == "misalign":  # one element off a 16-byte boundary
        n = math.prod(shape)
        return torch.zeros(n + 1, dtype=dtype)[1:].view(shape), "storage offset 1"
    if kind == "expand":  # stride 0 along the first dim
        return torch.zeros([1] + shape[1:], dtype=dtype).expand(shape), "expanded dim 0"
    if kind == "meta":
        return torch.empty(shape, dtype=dtype, device="meta"), "meta device"
    raise AssertionError(kind)


# The oracle: the documented rules (docs/api.md), written independently of gdnjit/gdn.py.


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _aligned16(x: torch.Tensor) -> bool:
    if x.numel() == 0:
        return True
    es = x.element_size()
    return x.data_ptr() % 16 == 0 and all(
        x.stride(d) * es % 16 == 0 for d in range(x.dim() - 1) if x.shape[d] > 1)


def _last_contig(x: torch.Tensor) -> bool:
    return x.shape[-1] <= 1 or x.stride(-1) == 1


def oracle(fn: str, a: dict) -> set[str]:
    """The arguments that break a documented rule (empty: the call is valid). Where an argument the
    others are measured against (q: B, T, H, K; v: HV, V) is bad, only it is reported."""
    get = a.get
    if fn == "mtp":
        flag = get("disable_state_update", None)  # FlashInfer's convention: a bool / int by truth value; None: True
        if flag is not None and not isinstance(flag, int):
            return {"disable_state_update"}
        layout, direct, update = "klast", False, not (flag is None or bool(flag))
        pool = get("initial_state")
    elif fn == "pretranspose":
        layout, update = "klast", True
        pool_mode = get("initial_state") is not None or get("initial_state_indices") is not None
        if pool_mode:
            if get("initial_state") is None or get("initial_state_indices") is None:
                return {"initial_state", "initial_state_indices"}
            if get("state") is not None and get("state") is not get("initial_state"):
                return {"state"}
            direct, pool = False, get("initial_state")
        else:
            if get("output_state_indices") is not None:
                return {"output_state_indices"}
            if get("state") is None:
                return {"state"}
            direct, pool = True, get("state")
    else:
        if get("state") is None:
            return {"state"}
        layout, direct, update, pool = "kmajor", True, True, get("state")
    sname = "state" if direct else "initial_state"
    write = None if direct else get("output_state_indices")
    inter = get("intermediate_states_buffer") if fn == "mtp" else None
    ssm = get("ssm_state_indices") if fn == "mtp" else None

    q, k, v = get("q"), get("k"), get("v")
    if not (_is_tensor(q) and q.dim() == 4 and q.dtype in IN_DTYPES):
        return {"q"}
    B, T, H, K = q.shape
    if K not in (64, 128, 256) or not 1 <= T <= 16 or H < 1:
        return {"q"}
    dev = q.device
    bad = set()

    def tensor_ok(name, x, ndim, dtypes, shape=None) -> bool:
        ok = _is_tensor(x) and x.dim() == ndim and x.dtype in dtypes and x.device == dev and (
            shape is None or tuple(x.shape) == tuple(shape))
        if not ok:
            bad.add(name)
        return ok

    if not _last_contig(q) or not _aligned16(q):
        bad.add("q")
    if tensor_ok("k", k, 4, (q.dtype,), q.shape) and not (_last_contig(k) and _aligned16(k)):
        bad.add("k")
    if not (_is_tensor(v) and v.dim() == 4 and v.dtype == q.dtype and v.device == dev
            and tuple(v.shape[:2]) == (B, T) and v.shape[3] in (64, 128, 256)
            and v.shape[2] >= H and v.shape[2] % H == 0 and _last_contig(v)):
        return bad | {"v"}
    HV, V = v.shape[2], v.shape[3]
    for name in ("a", "b"):
        tensor_ok(name, get(name), 3, (q.dtype,), (B, T, HV))
    for name, dts in (("A_log", (torch.float32,)), ("dt_bias", DTB_DTYPES)):
        tensor_ok(name, get(name), 1, dts, (HV,))  # any stride (the kernels take it)
    s = get("scale")
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))):
        bad.add("scale")
    elif s is not None and not (abs(s) <= 3.4028234663852886e38):  # NaN, inf, beyond fp32: refused (docs/api.md)
        bad.add("scale")
    if not isinstance(get("use_qk_l2norm", True), bool):
        bad.add("use_qk_l2norm")

    slot = (HV, V, K) if layout == "klast" else (HV, K, V)
    if tensor_ok(sname, pool, 4, STATE_DTYPES):
        # docs/api.md: a state may be strided inside its slots (last dim contiguous, 16-byte strides, rows and
        # heads not overlapping); slots may not overlap (slot stride >= the span of one slot)
        st = pool.stride()
        span = 1 + sum((n - 1) * s_ for n, s_ in zip(slot, st[1:]))
        if tuple(pool.shape[1:]) != slot or (direct and pool.shape[0] != B) or st[3] != 1 or \
                not _aligned16(pool) or (slot[1] > 1 and st[2] < slot[2]) or \
                (slot[0] > 1 and st[1] < (slot[1] - 1) * st[2] + slot[2]) or \
                (pool.shape[0] > 1 and st[0] < span):
            bad.add(sname)

    def index_ok(name, x, like=None) -> None:
        dts = (like.dtype,) if _is_tensor(like) and like.dtype in IDX_DTYPES else IDX_DTYPES
        if tensor_ok(name, x, 1, dts, (B,)) and B > 1 and x.stride(0) != 1:
            bad.add(name)

    if not direct:
        index_ok("initial_state_indices", get("initial_state_indices"))
        if write is not None:
            index_ok("output_state_indices", write, get("initial_state_indices"))
    if not update and write is not None:
        bad.add("output_state_indices")
    if inter is not None:
        if tensor_ok("intermediate_states_buffer", inter, 5, STATE_DTYPES) and not (
                inter.shape[0] >= B and inter.shape[1] >= T and tuple(inter.shape[2:]) == slot
                and inter.is_contiguous() and _aligned16(inter)):
            bad.add("intermediate_states_buffer")
    if ssm is not None:
        if inter is not None or not update:
            bad.add("ssm_state_indices")
        if write is not None:
            bad |= {"ssm_state_indices", "output_state_indices"}
        tensor_ok("ssm_state_indices", ssm, 2, IDX_DTYPES, (B, T))
    out = get("output")
    if out is not None and tensor_ok("output", out, 4, OUT_DTYPES, (B, T, HV, V)) and (
            not _last_contig(out) or any(n > 1 and sd == 0 for n, sd in zip(out.shape, out.stride()))):
        bad.add("output")  # rows that alias each other (stride 0, e.g. expand) would race
    return bad


FUNCTIONS = {
    "pretranspose": gdnjit.gated_delta_rule_decode_pretranspose,
    "mtp": gdnjit.gated_delta_rule_mtp,
    "decode": gdnjit.gated_delta_rule_decode,
}
_MSG = re.compile(r"^(\w+)(?: and (\w+))?: \S")


@pytest.fixture(scope="module")
def no_launch():
    """Validation runs on CPU tensors; anything that gets past it raises Reached instead of dispatching."""
    mp = pytest.MonkeyPatch()
    mp.setattr(gdn, "prepare", functools.partial(gdn.prepare, require_cuda=False))

    def reached(*a, **kw):
        raise Reached()

    mp.setattr(runner.RUNNER, "resolve", reached)
    mp.setattr(Launcher, "__call__", reached)
    gdn._fast.clear()
    gdn._guarded.clear()
    yield
    mp.undo()
    gdn._fast.clear()
    gdn._guarded.clear()


@FUZZ
@given(gdn_case())
def test_fuzz_gdn_argument_checks(no_launch, case):
    fn, args, mutations = case
    expected = oracle(fn, args)
    call_args = {k: v for k, v in args.items() if not (k == "disable_state_update" and fn != "mtp")}
    try:
        result = FUNCTIONS[fn](**call_args)
    except Reached:
        assert not expected, f"invalid input reached dispatch: {expected} ({mutations})"
        event("reached dispatch")
        return
    except (TypeError, ValueError) as e:
        msg = str(e)
        m = _MSG.match(msg)
        assert m, f"message does not start with an argument name: {msg!r}"
        named = {n for n in m.groups() if n}
        assert named <= ARG_NAMES, msg
        assert expected, f"valid input refused: {msg} ({mutations})"
        assert named & expected, f"names {named}, but the bad arguments are {expected}: {msg} ({mutations})"
        event(f"{type(e).__name__} naming {sorted(named)[0]}")
        return
    # no exception and no dispatch: only B == 0 returns early (an empty output, nothing launched)
    assert not expected, f"invalid input accepted: {expected} ({mutations})"
    assert args["q"].shape[0] == 0 and result[0].shape[0] == 0


def test_oracle_agrees_on_the_plain_cases(no_launch):
    """The oracle itself: valid calls of each function reach dispatch; a few obvious faults are named."""
    from hypothesis import find

    for fn in FUNCTIONS:
        case = find(gdn_case(), lambda c, fn=fn: c[0] == fn and not c[2] and c[1]["q"].shape[0] > 0,
                    settings=settings(database=None, max_examples=500))
        assert oracle(fn, case[1]) == set()
        with pytest.raises(Reached):
            FUNCTIONS[fn](**{k: v for k, v in case[1].items() if not (k == "disable_state_update" and fn != "mtp")})
        bad = dict(case[1], A_log=case[1]["A_log"].double())
        assert oracle(fn, bad) == {"A_log"}


# ---- (d) lazy-state argument checks ---------------------------------------------------------------

LAZY_ARG_NAMES = {
    "q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "state_indices", "cache", "cache.k", "cache.u", "cache.g",
    "cache.cursor", "num_accepted", "scale", "use_qk_l2norm", "softplus_beta", "softplus_threshold", "null_block_id",
    "output",
}
LAZY_TENSORS = ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "state_indices", "num_accepted", "output")
LAZY_SCALARS = {"scale": SCALES, "softplus_beta": SCALES, "softplus_threshold": SCALES, "use_qk_l2norm": FLAGS,
                "null_block_id": [-2, -1, 0, 3, 1.0, True, None, "0", 10 ** 20]}
_NAMED_MSG = re.compile(r"^([\w.]+): \S")


def _mutated_tensor(draw, x):
    """A tensor argument made wrong in one way (or None, or not a tensor)."""
    kind = draw(st.sampled_from(["dtype", "grow", "dims", "strided", "none", "other"]))
    if kind == "none":
        return None, kind
    if kind == "other" or not isinstance(x, torch.Tensor):
        return draw(st.sampled_from(NON_TENSORS)), "other"
    if kind == "dtype":
        return torch.zeros(x.shape, dtype=draw(st.sampled_from(ALL_DTYPES))), kind
    if kind == "grow" and x.dim() > 0:
        d = draw(st.integers(0, x.dim() - 1))
        shape = list(x.shape)
        shape[d] += draw(st.sampled_from([1, 16]))
        return torch.zeros(shape, dtype=x.dtype), f"grow dim {d}"
    if kind == "dims":
        return (x[..., None] if draw(st.booleans()) or x.dim() == 0 or x.shape[0] == 0 else x[0]), kind
    if x.dim() == 0 or x.shape[-1] < 2:
        return x[..., None], "dims"
    return torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)[..., ::2], kind


def _mutate(draw, args: dict, tensors: tuple, scalars: dict, cache_type: type | None = None) -> list:
    """Up to two of ``args`` made wrong in place: a tensor (_mutated_tensor), a scalar (one of ``scalars[name]``),
    or with ``cache_type`` (a named tuple of tensors) the cache (one field, or the whole of it); returns the
    descriptions."""
    mutations = []
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(tensors + tuple(scalars) + (("cache",) if cache_type else ())))
        if name in scalars:
            args[name] = draw(st.sampled_from(scalars[name]))
            mutations.append(f"{name}={args[name]!r}")
        elif name == "cache":
            n = len(cache_type._fields)
            i = draw(st.integers(0, n))
            if i == n or not isinstance(args["cache"], cache_type):
                args["cache"] = draw(st.sampled_from([None, (1, 2, 3, 4), ()]))
                mutations.append(f"cache: not a {cache_type.__name__}")
            else:
                fields = list(args["cache"])
                fields[i], what = _mutated_tensor(draw, fields[i])
                args["cache"] = cache_type(*fields)
                mutations.append(f"cache field {i}: {what}")
        else:
            args[name], what = _mutated_tensor(draw, args.get(name))
            mutations.append(f"{name}: {what}")
    return mutations


def _clean_refusal(e: Exception, names: set, mutations: list) -> None:
    """A refused call's error: one line starting with an argument's (or the function's) name, for a call that had
    something wrong."""
    msg = str(e)
    assert "\n" not in msg, msg
    m = _NAMED_MSG.match(msg)
    assert m and m.group(1) in names, f"message does not start with an argument name: {msg!r}"
    assert mutations, f"valid input refused: {msg}"
    event(f"{type(e).__name__} naming {m.group(1)}")


@st.composite
def lazy_case(draw):
    """(kwargs of gdnjit.lazy.prepare_step, mutations): valid before the mutations."""
    B, T = draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([1, 2, 16]))
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2]))
    K, V = draw(st.sampled_from([64, 128, 256])), draw(st.sampled_from([64, 128]))
    dt = draw(st.sampled_from(IN_DTYPES))
    sdt, rdt = (draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float16))) for _ in range(2))
    S = B + draw(st.sampled_from([1, 3]))
    args = dict(q=torch.zeros(B, T, H, K, dtype=dt), k=torch.zeros(B, T, H, K, dtype=dt),
                v=torch.zeros(B, T, HV, V, dtype=dt), A_log=torch.zeros(HV, dtype=draw(st.sampled_from(DTB_DTYPES))),
                a=torch.zeros(B, T, HV, dtype=dt), dt_bias=torch.zeros(HV, dtype=draw(st.sampled_from(DTB_DTYPES))),
                b=torch.zeros(B, T, HV, dtype=dt), state=torch.zeros(S, HV, V, K, dtype=sdt),
                state_indices=torch.arange(B, dtype=draw(st.sampled_from(IDX_DTYPES))),
                cache=gdnjit.lazy_cache(S, H, HV, K, V, dtype=rdt),
                num_accepted=torch.zeros(B, dtype=torch.int32) if draw(st.booleans()) else None, scale=None,
                use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0, null_block_id=-1,
                output=torch.zeros(B, T, HV, V, dtype=draw(st.sampled_from(OUT_DTYPES))) if draw(st.booleans()) else None)
    mutations = _mutate(draw, args, LAZY_TENSORS, LAZY_SCALARS, cache_type=gdnjit.LazyCache)
    return args, mutations


@FUZZ
@given(lazy_case())
def test_fuzz_lazy_argument_checks(case):
    """gdnjit.lazy's step checks on random valid calls with up to two arguments made wrong: the checks accept a call
    or refuse it with a TypeError / ValueError whose one-line message starts with the argument's name; no other
    exception escapes (a kernel would otherwise get what it cannot take); a call with no mutation is accepted."""
    args, mutations = case
    try:
        output, call = prepare_step(*args.values(), require_cuda=False)
    except (TypeError, ValueError) as e:
        _clean_refusal(e, LAZY_ARG_NAMES, mutations)
        return
    event("accepted")
    (B, T), (HV, V) = args["q"].shape[:2], args["v"].shape[2:]
    assert (call is None) == (B == 0) and tuple(output.shape) == (B, T, HV, V), mutations
    if call is not None:
        _pack(call)


def _pack(call) -> bytes:
    """A named call's arguments packed as the launch packs them: every value fits its kernel argument's type."""
    return struct.pack("<" + "".join({"ptr": "Q", "i64": "q", "i32": "i", "f32": "f"}[ty] for _, ty in call.spec.args),
                       *call.arg_values())


UCACHE_FNS = ("gated_delta_rule_mtp_ucache", "gated_delta_rule_mtp_ucache_flush")
UCACHE_ARG_NAMES = {
    "q", "k", "v", "a", "b", "A_log", "dt_bias", "initial_state_source", "initial_state_indices", "k_cache", "u_cache",
    "g_cache", "hist_len", "cache_base", "flush_min", "scale", "softplus_beta", "softplus_threshold", "output",
    "use_qk_l2norm_in_kernel", "restart_hist_on_flush", "disable_state_update", *UCACHE_FNS,
}
UCACHE_TENSORS = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "initial_state_source", "initial_state_indices",
                  "k_cache", "u_cache", "g_cache", "hist_len", "cache_base", "output")
UCACHE_SCALARS = {"scale": SCALES, "softplus_beta": SCALES, "softplus_threshold": SCALES,
                  "use_qk_l2norm_in_kernel": FLAGS, "restart_hist_on_flush": FLAGS, "disable_state_update": FLAGS,
                  "flush_min": [None, 0, 1, 15, 16, 17, -1, 2.0, True, "3", 10 ** 20]}


@st.composite
def ucache_case(draw):
    """(function name, kwargs, mutations) for FlashInfer's u-cache calls, valid before the mutations."""
    flush = draw(st.booleans())
    fn = UCACHE_FNS[flush]
    B, T = draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([1, 2, 4, 16]))
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2]))
    K, V = draw(st.sampled_from([64, 128])), draw(st.sampled_from([64, 128]))
    dt = draw(st.sampled_from(IN_DTYPES))
    sdt, rdt = (draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float16))) for _ in range(2))
    S, rows = B + draw(st.sampled_from([1, 3])), 32 if flush else 16
    args = dict(A_log=torch.zeros(HV), a=torch.zeros(B, T, HV, dtype=dt), dt_bias=torch.zeros(HV),
                q=torch.zeros(B, T, H, K, dtype=dt), k=torch.zeros(B, T, H, K, dtype=dt),
                v=torch.zeros(B, T, HV, V, dtype=dt), b=torch.zeros(B, T, HV, dtype=dt),
                initial_state_source=torch.zeros(S, HV, V, K, dtype=sdt),
                initial_state_indices=torch.arange(B, dtype=draw(st.sampled_from(IDX_DTYPES))) if draw(st.booleans())
                else None,
                k_cache=torch.zeros(S, H, rows, K, dtype=rdt), u_cache=torch.zeros(S, HV, rows, V, dtype=rdt),
                g_cache=torch.zeros(S, HV, rows), hist_len=torch.zeros(B, dtype=torch.int32))
    if flush:
        args["cache_base"] = torch.zeros(B, dtype=torch.int32)
    flush_only = ("cache_base", "flush_min", "restart_hist_on_flush")  # not the verify-only call's arguments
    mutations = _mutate(draw, args, tuple(n for n in UCACHE_TENSORS if flush or n not in flush_only),
                        {n: v for n, v in UCACHE_SCALARS.items() if flush or n not in flush_only})
    return fn, args, mutations


@pytest.fixture(scope="module")
def ucache_no_launch():
    """The u-cache calls' checks on CPU tensors; a call that passes them raises Reached instead of launching."""
    from gdnjit import lazy as lazy_mod, ucache

    mp = pytest.MonkeyPatch()
    check_state = lazy_mod.check_state
    mp.setattr(lazy_mod, "check_state", lambda state, require_cuda=True: check_state(state, False))

    def reached(*a, **kw):
        raise Reached()

    mp.setattr(ucache, "launch_device", reached)
    yield
    mp.undo()


@FUZZ
@given(ucache_case())
def test_fuzz_ucache_argument_checks(ucache_no_launch, case):
    """FlashInfer's u-cache drop-ins on random valid calls with up to two arguments made wrong: each call reaches the
    launch or is refused with a TypeError / ValueError (gdnjit.ContractError among them) whose one-line message starts
    with the argument's name or the function's; no other exception escapes; a call with no mutation is accepted."""
    fn, args, mutations = case
    try:
        out = getattr(gdnjit, fn)(**args)
    except Reached:
        event("reached the launch")
        return
    except (TypeError, ValueError) as e:
        _clean_refusal(e, UCACHE_ARG_NAMES, mutations)
        return
    assert args["q"].shape[0] == 0 and out.shape[0] == 0, mutations  # B == 0: an empty output, nothing launched


@st.composite
def spec_step_case(draw):
    """(kwargs of gdnjit.spec_step.prepare, flush, mutations) for the fused speculative step or its flush, valid before
    the mutations (a flush takes no tokens: only its pool, indices, accepted counts, cache and flags are mutated)."""
    from gdnjit.spec_step import SpecCache, spec_cache

    B, T = draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([1, 2, 8]))
    H = draw(st.sampled_from([1, 2]))
    HV = H * draw(st.sampled_from([1, 2]))
    K, V = draw(st.sampled_from([64, 128])), draw(st.sampled_from([64, 128]))
    dt, S = draw(st.sampled_from(IN_DTYPES)), B + 2
    args = dict(q=torch.zeros(B, T, H, K, dtype=dt), k=torch.zeros(B, T, H, K, dtype=dt),
                v=torch.zeros(B, T, HV, V, dtype=dt), A_log=torch.zeros(HV), a=torch.zeros(B, T, HV, dtype=dt),
                dt_bias=torch.zeros(HV), b=torch.zeros(B, T, HV, dtype=dt),
                state=torch.zeros(S, HV, V, K, dtype=draw(st.sampled_from(STATE_DTYPES))),
                state_indices=torch.arange(B, dtype=torch.int32), num_accepted=torch.zeros(B, dtype=torch.int32),
                cache=spec_cache(S, H, HV, T, K, V, dtype=dt), scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                softplus_threshold=20.0, null_block_id=-1, output=None)
    flush = draw(st.booleans())
    tensors = ("state", "state_indices", "num_accepted")
    scalars = {n: v for n, v in LAZY_SCALARS.items() if not flush or n in ("use_qk_l2norm", "null_block_id")}
    mutations = _mutate(draw, args, tensors if flush else tensors + ("q", "k", "v", "A_log", "a", "dt_bias", "b",
                                                                      "output"), scalars, cache_type=SpecCache)
    return args, flush, mutations


@FUZZ
@given(spec_step_case())
def test_fuzz_spec_step_argument_checks(case):
    """The fused speculative step's and its flush's checks on random valid calls with arguments made wrong: accepted
    (the arguments pack for the launch) or refused with a TypeError / ValueError naming the argument, one line."""
    from gdnjit.spec_step import SpecCache, prepare as spec_prepare

    args, flush, mutations = case
    names = {*args, *(f"cache.{f}" for f in SpecCache._fields)}
    try:
        out, call = spec_prepare(*args.values(), flush=flush, require_cuda=False)
    except (TypeError, ValueError) as e:
        _clean_refusal(e, names, mutations)
        return
    event("accepted")
    if call is not None:
        _pack(call)


# ---- (e) conv1d update argument checks -----------------------------------------------------------

CONV_ARG_NAMES = {"x", "conv_state", "weight", "bias", "activation", "conv_state_indices", "num_accepted_tokens",
                  "query_start_loc", "max_query_len", "pad_slot_id", "out"}
CONV_TENSORS = ("x", "conv_state", "weight", "bias", "conv_state_indices", "num_accepted_tokens", "query_start_loc",
                "out")
CONV_SCALARS = {"activation": [None, "silu", "swish", True, False, "relu", 1, [1]],
                "max_query_len": [None, -1, 0, 1, 3, 65, 2.0, True, 10 ** 20],
                "pad_slot_id": [None, -1, 0, 7, 2 ** 63, -2 ** 63 - 1, 1.5, True, "1"]}


@st.composite
def conv_case(draw):
    """(kwargs of gdnjit.conv.prepare, mutations): valid before the mutations (plain [B, D], [B, D, T] with or
    without accepted counts, or varlen [tokens, D])."""
    B, D, W = draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([8, 16, 24])), draw(st.integers(2, 6))
    dt = draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float16)))
    kind = draw(st.sampled_from(["2d", "3d", "varlen"]))
    T = 1 if kind == "2d" else draw(st.sampled_from([1, 2, 4]))
    acc = kind != "2d" and draw(st.booleans())
    S = B + draw(st.sampled_from([0, 2]))
    idx = torch.arange(B, dtype=draw(st.sampled_from(IDX_DTYPES))) if kind == "varlen" or draw(st.booleans()) else None
    x = {"2d": torch.zeros(B, D, dtype=dt), "3d": torch.zeros(B, D, T, dtype=dt),
         "varlen": torch.zeros(B * T, D, dtype=dt)}[kind]
    args = dict(x=x, conv_state=torch.zeros(S, D, W - 2 + T if acc else W - 1, dtype=dt),
                weight=torch.zeros(D, W, dtype=dt), bias=torch.zeros(D, dtype=dt) if draw(st.booleans()) else None,
                activation=draw(st.sampled_from([None, "silu"])), conv_state_indices=idx,
                num_accepted_tokens=torch.ones(B, dtype=torch.int32) if acc else None,
                query_start_loc=torch.arange(0, B * T + 1, T, dtype=torch.int32) if kind == "varlen" else None,
                max_query_len=T if kind == "varlen" else None, pad_slot_id=draw(st.sampled_from([None, -1])),
                out=torch.zeros_like(x) if draw(st.booleans()) else None)
    mutations = _mutate(draw, args, CONV_TENSORS, CONV_SCALARS)
    return args, mutations


@FUZZ
@given(conv_case())
def test_fuzz_conv_argument_checks(case):
    """gdnjit.conv's checks (causal_conv1d_update) on random valid calls with up to two arguments made wrong: the
    call is accepted (its arguments pack for the launch) or refused with a TypeError / ValueError whose one-line
    message starts with the argument's name; no other exception escapes; a call with no mutation is accepted."""
    from gdnjit import conv

    args, mutations = case
    try:
        out, call = conv.prepare(*args.values(), require_cuda=False)
    except (TypeError, ValueError) as e:
        _clean_refusal(e, CONV_ARG_NAMES, mutations)
        return
    event("accepted")
    if call is not None:  # every value fits its kernel argument (the launch packs them so)
        event("accepted with a launch")
        _pack(call)


# ---- known bugs (found by the fuzzers above), pinned until fixed ---------------------------------
# KNOWN_BUGS:
#   spec-1    gdnjit/spec.py parse_spec (lines 242 and 265): `cons_doc.line_of(i)` / `rules_doc.line_of(i)`
#             assume the loader's LineList; a plain parsed document (yaml.safe_load, a dict built in
#             code) raises AttributeError even when valid. Use the `_err`-style `isinstance` guard.
#   shapes-1  gdnjit/shapes.py load_shapes: `params.update(call.get("params") or {})` — a truthy
#             non-mapping `params` raises TypeError/ValueError instead of SpecError.
#   shapes-2  gdnjit/spec.py get_spec: a spec name over the file-name limit raises OSError
#             (ENAMETOOLONG from Path.is_file), which load_shapes does not turn into a SpecError.
#   shapes-3  gdnjit/shapes.py load_shapes: an empty list for a call param silently expands to no
#             problems (nothing to warm) instead of an error.
#   gdn-1     gdnjit/gdn.py _run / prepare: a sparse tensor argument raises RuntimeError ("Cannot
#             access data pointer of Tensor that doesn't have storage") instead of TypeError.
#   gdn-2     gdnjit/validate.py real_number: scale=10**400 raises OverflowError; scale=1e300 passes
#             validation and fails at launch (struct.pack 'f') after a compile.
#   gdn-3     gdnjit/gdn.py prepare: an output whose rows overlap in memory (stride 0, e.g. from
#             expand) is accepted; the kernel's rows then race on the same elements.
#   ucache-1  gdnjit/ucache.py gated_delta_rule_mtp_ucache_flush: restart_hist_on_flush's range check ran
#             before the cursors' checks: a bool / complex hist_len raised RuntimeError from aminmax, and on a
#             CPU-only torch torch.cuda.is_current_stream_capturing() did (session 53's u-cache fuzz).
#   conv-1    gdnjit/conv.py prepare: a 0-dim x raised IndexError (x.shape[0]); a pad_slot_id past int64 passed
#             the checks and failed when the launch packed it (session 53's conv fuzz; pinned in
#             tests/ops/test_conv_validation.py, with T = 0's message now "expected 1..64 tokens").
#   spec-2    gdnjit/expr_jinja.py: a number literal past the float range (`dispatch_params` entry `1E400`,
#             `int(1E400)`) compiled by Jinja as the name `inf`: parse_spec raised NameError, not SpecError
#             (session 53's CI run of test_fuzz_spec_loader).
#   spec-3    gdnjit/spec_step.py prepare (flush): a cache whose k is None or not a tensor raised AttributeError
#             (`cache[0].dim()`) before its checks (session 53's spec-step fuzz; pinned in tests/test_spec_step.py).


def test_bug_spec_plain_document():
    spec = parse_spec(yaml.safe_load((SPEC_DIR / "gdn.yaml").read_text()), "gdn.yaml")
    assert spec == get_spec("gdn") or spec.name == "gdn"


@pytest.mark.parametrize("text", ["1E400", "int(1E400)"])
def test_bug_spec_float_literal_past_the_range(text):
    doc = copy.deepcopy(GDN_DOC)
    doc["dispatch_params"]["inter_dtype"] = text
    with pytest.raises(SpecError, match=r"dispatch_params\.inter_dtype.*past the float range"):
        parse_spec(lined(doc), SPEC_FILE)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.int64, torch.float32])
def test_bug_ucache_cursor_dtype_before_its_range(ucache_no_launch, dtype):
    bf, B, T, HV = torch.bfloat16, 3, 2, 2
    with pytest.raises(TypeError, match=r"^hist_len: expected dtype int32"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(
            torch.zeros(HV), torch.zeros(B, T, HV, dtype=bf), torch.zeros(HV), q=torch.zeros(B, T, 1, 64, dtype=bf),
            k=torch.zeros(B, T, 1, 64, dtype=bf), v=torch.zeros(B, T, HV, 64, dtype=bf),
            b=torch.zeros(B, T, HV, dtype=bf), initial_state_source=torch.zeros(4, HV, 64, 64, dtype=bf),
            k_cache=torch.zeros(4, 1, 32, 64, dtype=bf), u_cache=torch.zeros(4, HV, 32, 64, dtype=bf),
            g_cache=torch.zeros(4, HV, 32), hist_len=torch.zeros(B, dtype=dtype),
            cache_base=torch.zeros(B, dtype=torch.int32))


def _shapes_file(tmp_path: Path, mutate) -> Path:
    doc = copy.deepcopy(SHAPES_DOC)
    mutate(doc)
    path = tmp_path / "shapes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("params", [[1, 2], "ab", 5])
def test_bug_shapes_call_params_not_a_mapping(tmp_path, params):
    path = _shapes_file(tmp_path, lambda d: d["calls"][0].__setitem__("params", params))
    with pytest.raises(SpecError, match=r"calls\[0\]\.params"):
        load_shapes(path)


def test_bug_shapes_spec_name_too_long(tmp_path):
    path = _shapes_file(tmp_path, lambda d: d["calls"][0].__setitem__("spec", "x" * 300))
    with pytest.raises(SpecError, match=r"calls\[0\]\.spec"):
        load_shapes(path)


def test_bug_shapes_empty_value_list(tmp_path):
    path = _shapes_file(tmp_path, lambda d: d["calls"][0]["params"].__setitem__("T", []))
    with pytest.raises(SpecError, match=r"calls\[0\]\.params\.T"):
        load_shapes(path)


def _valid(fn="decode") -> dict:
    from hypothesis import find

    return find(gdn_case(), lambda c: c[0] == fn and not c[2] and c[1]["q"].shape[0] > 1,
                settings=settings(database=None, max_examples=500))[1]


@pytest.mark.parametrize("name", ["q", "a", "A_log", "state"])
def test_bug_gdn_sparse_tensor(no_launch, name):
    args = _valid()
    args[name] = args[name].to_sparse()
    with pytest.raises((TypeError, ValueError), match=f"^{name}: "):
        gdnjit.gated_delta_rule_decode(**args)


@pytest.mark.parametrize("scale", [10 ** 400, 1e300, -1e39], ids=["10**400", "1e300", "-1e39"])
def test_bug_gdn_scale_out_of_fp32_range(no_launch, scale):
    args = dict(_valid(), scale=scale)
    with pytest.raises((TypeError, ValueError), match="^scale: "):
        gdnjit.gated_delta_rule_decode(**args)


def test_bug_gdn_overlapping_output(no_launch):
    args = _valid()
    B, T, HV, V = args["v"].shape
    args["output"] = torch.empty(1, T, HV, V, dtype=args["q"].dtype).expand(B, T, HV, V)
    with pytest.raises(ValueError, match="^output: "):
        gdnjit.gated_delta_rule_decode(**args)
