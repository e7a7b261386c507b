"""Kernel specs: the shipped spec loads; every validation error names file, key path and line;
expressions are sandboxed; ``Spec.violations``; the dispatcher's rule order and ``explain``."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gdnjit import dispatch
from gdnjit import expr as gexpr
from gdnjit import yamlio
from gdnjit.errors import SpecError
from gdnjit.shapes import SHAPES_DIR, load_shapes
from gdnjit.spec import SPEC_DIR, Spec, get_spec, list_specs, load_spec_file

GDN_TEXT = (SPEC_DIR / "gdn.yaml").read_text()
GDN_LINES = GDN_TEXT.splitlines()
FACTS = {"B": 1, "H": 16, "HV": 64, "num_sms": 132}


def _jinja_env():
    """The sandboxed Jinja environment of spec expressions (gdnjit.expr_jinja, imported on first need)."""
    from gdnjit.expr_jinja import ENV

    return ENV


# ---- helpers ------------------------------------------------------------------------------
# gdn.yaml evolves; the mutations below find their lines by structure (plain text search, not the
# loader under test) so they keep pointing at the intended key.


def line_of(text: str, needle: str, start: int = 1) -> int:
    """1-based number of the first line (at or after ``start``) containing ``needle``."""
    for i, line in enumerate(text.splitlines(), 1):
        if i >= start and needle in line:
            return i
    raise AssertionError(f"{needle!r} not in text")


def section(text: str, top: str) -> tuple[int, int]:
    """(first, last) line numbers of the top-level block ``top:`` (last: before the next top key)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if re.match(rf"{re.escape(top)}:", line))
    last = first
    for i in range(first + 1, len(lines) + 1):
        if re.match(r"[A-Za-z_]", lines[i - 1]):
            break
        last = i
    return first, last


def key_line(text: str, top: str, key: str) -> int:
    """Line of ``key:`` directly inside the top-level block ``top``."""
    first, last = section(text, top)
    lines = text.splitlines()
    for i in range(first + 1, last + 1):
        if re.match(rf"\s+{re.escape(key)}:", lines[i - 1]):
            return i
    raise AssertionError(f"no {top}.{key} in text")


def item_lines(text: str, top: str) -> list[int]:
    """Lines of the ``- `` items of the top-level list ``top``."""
    first, last = section(text, top)
    lines = text.splitlines()
    return [i for i in range(first + 1, last + 1) if re.match(r"\s*- ", lines[i - 1])]


def item_key_line(text: str, top: str, index: int, key: str) -> int:
    """Line of ``key:`` within item ``index`` of the top-level list ``top``."""
    items = item_lines(text, top) + [section(text, top)[1] + 1]
    lines = text.splitlines()
    for i in range(items[index], items[index + 1]):
        if re.match(rf"\s*(- )?{re.escape(key)}:", lines[i - 1]):
            return i
    raise AssertionError(f"no {top}[{index}].{key} in text")


def set_line(text: str, lineno: int, new: str) -> str:
    """Replace line ``lineno``'s content after its indentation (and a leading ``- `` if any)."""
    lines = text.splitlines()
    m = re.match(r"(\s*(- )?)", lines[lineno - 1])
    lines[lineno - 1] = m.group(1) + new
    return "\n".join(lines) + "\n"


def replace_line(text: str, old: str, new: str) -> str:
    """Replace the one line that equals ``old`` (stripped) with ``new`` (indentation kept)."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == old]
    assert len(hits) == 1, f"{old!r} matches {len(hits)} lines"
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + new
    return "\n".join(lines) + "\n"


def flow(mapping: dict) -> str:
    return yaml.safe_dump(mapping, default_flow_style=True, sort_keys=False, width=1000).strip()


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def spec_error(tmp_path: Path, text: str, key: str, line: int | None) -> SpecError:
    """Load ``text`` from a temp file; assert SpecError naming the file, ``key`` and ``line``."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as ei:
        load_spec_file(path)
    e = ei.value
    msg = str(e)
    assert e.file == str(path)
    assert str(path) in msg
    assert e.key == key, msg
    assert f": {key}: " in msg, msg
    if line is not None:
        assert e.line == line, msg
        assert msg.startswith(f"{path}:{line}: "), msg
    return e


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1000)


def gdn_doc() -> dict:
    # libyaml's safe loader (the shipped file reads the same both ways: test_shipped_yaml_loads_alike_with_libyaml):
    # ~10x faster, and this runs at collection time
    return yaml.load(GDN_TEXT, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader


GDN = gdn_doc()
# a rule with `when` at index >= 1, and its use mapping
R = next(i for i, r in enumerate(GDN["rules"]) if i >= 1 and r.get("when"))
R_USE = GDN["rules"][R]["use"]
R_USE_LINE = item_key_line(GDN_TEXT, "rules", R, "use")
R_WHEN_LINE = item_key_line(GDN_TEXT, "rules", R, "when")
ILP_ALLOWED = GDN["tunables"]["ilp"]


# ---- the shipped spec -----------------------------------------------------------------------


def test_list_specs():
    assert list_specs() == sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
    assert "gdn" in list_specs()


def test_gdn_loads():
    spec = get_spec("gdn")
    assert isinstance(spec, Spec)
    assert spec.name == "gdn"
    assert spec.template == "gdn_{form}.cu.j2" and spec.template_fields == ("form",)
    assert [t for _, t in spec.template_expansions()] == [f"gdn_{f}.cu.j2" for f in spec.allowed("form")]
    assert spec.template_for({"form": "mma", "K": 64}) == "gdn_mma.cu.j2"
    plain = get_spec("causal_conv1d_update")
    assert plain.template == "causal_conv1d_update.cu.j2" and plain.template_fields == ()
    assert plain.template_for({}) == "causal_conv1d_update.cu.j2"
    assert plain.describe_template() == "causal_conv1d_update.cu.j2"
    nv = get_spec("nvfp4_quantize")  # one template per form: one global scale, per-token scales
    assert nv.template == "nvfp4_{scale}.cu.j2" and nv.template_fields == ("scale",)
    assert [t for _, t in nv.template_expansions()] == ["nvfp4_tensor.cu.j2", "nvfp4_token.cu.j2"]
    assert spec.kernel_name == "gdn_step"
    assert spec.param_names == tuple(GDN["params"])
    assert spec.allowed("K") == (64, 128, 256)
    assert spec.allowed("layout") == ("klast", "kmajor")
    assert spec.tunable_names == tuple(GDN["tunables"])
    assert {"lanes_per_row", "ilp", "tile_v"} <= set(spec.tunable_names)
    assert set(spec.facts) == {"B", "H", "HV", "num_sms"}
    assert dict(spec.launch).keys() == {"grid", "block", "smem"}
    assert spec.args[0] == ("q", "ptr") and ("scale", "f32") in spec.args
    assert len(spec.rules) == len(GDN["rules"])
    assert len(spec.constraints) == len(GDN["constraints"])
    # rules and constraints know their lines in the YAML file
    assert [r.line for r in spec.rules] == item_lines(GDN_TEXT, "rules")
    assert [c.line for c in spec.constraints] == item_lines(GDN_TEXT, "constraints")
    assert any(r.when is None for r in spec.rules)
    assert get_spec("gdn") is spec  # cached
    with pytest.raises(KeyError):
        spec.allowed("nope")


def test_gdn_loads_from_a_copy(tmp_path):
    spec = load_spec_file(write(tmp_path, GDN_TEXT, "gdn.yaml"))
    shipped = get_spec("gdn")
    assert spec.file == str(tmp_path / "gdn.yaml")
    assert shipped.file == "gdn.yaml"
    assert spec.rules == shipped.rules and spec.params == shipped.params and spec.derived == shipped.derived


def test_get_spec_unknown():
    with pytest.raises(ValueError, match="no shipped spec 'nope'"):
        get_spec("nope")


def test_roundtrip_dump_is_valid(tmp_path):
    """The dict-level helper itself produces a valid spec (so failures below are the mutations)."""
    load_spec_file(write(tmp_path, dump(gdn_doc())))


# ---- loading cost (issue 24) ------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
# issue 24's target is 20 ms for get_spec('gdn') in a fresh process. On the 2-core dev/CI machine parsing and
# checking it costs 56-59 ms of CPU (docs/perf.md "Spec loading"); a shipped spec comes from its validated record
# (gdnjit/spec_record.py) in ~2 ms. The bound fails if loading parses the shipped file again.
GET_SPEC_BOUND_MS = 20.0


def _child(code: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


_TIME_GET_SPEC = """
import json, time
t0, c0 = time.perf_counter(), time.process_time()
from gdnjit.spec import get_spec
t1, c1 = time.perf_counter(), time.process_time()
get_spec("gdn")
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "wall_ms": (t2 - t1) * 1e3, "cpu_ms": (c2 - c1) * 1e3}))
"""


def test_get_spec_in_a_fresh_process_is_fast():
    """get_spec('gdn') in a fresh process (after ``import gdnjit.spec``), median of 3 children, in the child's
    CPU time (other processes on the shared cores do not count); the import is reported, not bounded."""
    runs = [_child(_TIME_GET_SPEC) for _ in range(3)]
    cpu = statistics.median(r["cpu_ms"] for r in runs)
    shown = {k: [round(r[k], 1) for r in runs] for k in runs[0]}
    assert cpu <= GET_SPEC_BOUND_MS, f"get_spec('gdn') took {cpu:.1f} ms of CPU (bound {GET_SPEC_BOUND_MS}): {shown}"


_COMPILED_AT_LOAD = """
import json
from gdnjit import expr
import functools
compiled = []
compile_expr = expr.compile_expr.__wrapped__  # each text compiled once, as through the real lru_cache
@functools.lru_cache(maxsize=4096)
def record(text):
    compiled.append(text)
    return compile_expr(text)
expr.compile_expr = record
from gdnjit.spec import SPEC_DIR, list_specs, load_spec_file
out = {}
for name in list_specs():
    load_spec_file(SPEC_DIR / f"{name}.yaml")  # parsed and checked (get_spec would take the validated record)
    out[name] = list(compiled)
    compiled.clear()
print(json.dumps(out))
"""


def test_loading_compiles_only_what_the_fallback_check_evaluates():
    """Loading parses every expression (errors at load) but compiles only what the checks at load evaluate:
    pieces of constraints and derived values (the fallback check), param domains (each listed value
    must be inside) and dispatch_params (each value they give must be listed). Rule conditions and launch
    shapes wait for their first use."""
    compiled = _child(_COMPILED_AT_LOAD)
    for name in list_specs():
        spec = get_spec(name)
        texts = [e for _, e in spec.derived] + [c.expr for c in spec.constraints] + [e for _, e in spec.domains]
        texts += [e for _, e in spec.dispatch_params]
        pieces = {p for e in texts for p in gexpr.conjuncts(e)}
        assert compiled[name], name
        assert set(compiled[name]) <= pieces, (name, set(compiled[name]) - pieces)
        assert len(compiled[name]) == len(set(compiled[name]))  # each once
        later = {r.when for r in spec.rules if r.when} | {e for _, e in spec.launch}
        assert not (set(compiled[name]) & (later - pieces)), name


def _yaml_shape(x):
    """A loaded document with every line number the loader recorded, for equality."""
    if isinstance(x, dict):
        return ("map", type(x).__name__, x.line, x.key_lines, [(k, _yaml_shape(v)) for k, v in x.items()])
    if isinstance(x, list):
        return ("seq", type(x).__name__, x.line, x.item_lines, [_yaml_shape(v) for v in x])
    return (type(x).__name__, x)


@pytest.mark.parametrize("path", sorted(SPEC_DIR.glob("*.yaml")) + sorted(SHAPES_DIR.glob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_yaml_loads_alike_with_libyaml(path):
    """The shipped specs and shapes files are read with libyaml (``fast``); libyaml accepts a few things the
    pure-Python loader does not (yamlio.load_yaml), so each file must give the same document, lines included."""
    if yamlio._CLoader is None:
        pytest.skip("PyYAML without libyaml: the pure-Python loader reads everything")
    text = path.read_text()
    assert _yaml_shape(yamlio.load_yaml(text, path.name, fast=True)) == _yaml_shape(yamlio.load_yaml(text, path.name))


@pytest.mark.parametrize("text", ["a: b: c\n", "a: 1\na: 2\n", "a: [1, 2\n", "a:\n  - 1\n - 2\n", "a: 'x\n"])
def test_libyaml_errors_are_the_pure_loaders(text):
    """A text libyaml refuses is parsed again by the pure-Python loader: the error's message and line are its."""
    if yamlio._CLoader is None:
        pytest.skip("PyYAML without libyaml")
    with pytest.raises(Exception):  # noqa: B017 - libyaml's own error, whatever it is, is not shown
        yaml.load(text, Loader=yamlio._CLoader)  # noqa: S506
    errors = []
    for fast in (True, False):
        with pytest.raises(SpecError) as ei:
            yamlio.load_yaml(text, "f.yaml", fast=fast)
        errors.append((str(ei.value), ei.value.line))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("text", ["a: 1\nb: [1,\t2]\n", "a: |#\n  x\n"])
def test_libyaml_accepts_more_so_other_files_keep_the_pure_loader(text, tmp_path):
    """libyaml reads texts the pure-Python loader refuses (why only gdnjit's own files are read with it): a spec
    or shapes file given by path is still refused, with the pure-Python loader's error."""
    if yamlio._CLoader is None:
        pytest.skip("PyYAML without libyaml")
    assert yamlio.load_yaml(text, "f.yaml", fast=True)
    with pytest.raises(SpecError) as pure:
        yamlio.load_yaml(text, "f.yaml")
    path = write(tmp_path, text)
    for load in (load_spec_file, load_shapes):
        with pytest.raises(SpecError) as ei:
            load(path)
        assert (ei.value.key, ei.value.reason, ei.value.line) == ("<yaml>", pure.value.reason, pure.value.line)


# ---- YAML-level errors ---------------------------------------------------------------------


def test_bad_yaml_syntax(tmp_path):
    line = key_line(GDN_TEXT, "params", "K")
    spec_error(tmp_path, set_line(GDN_TEXT, line, "K: a: b"), "<yaml>", line)


def test_bad_yaml_unclosed_flow(tmp_path):
    text = set_line(GDN_TEXT, R_USE_LINE, "use: {lanes_per_row: 16, ilp: 2")
    e = spec_error(tmp_path, text, "<yaml>", None)
    assert e.line is not None and e.line >= R_USE_LINE


def test_duplicate_yaml_key(tmp_path):
    line = key_line(GDN_TEXT, "params", "K")
    lines = GDN_TEXT.splitlines(keepends=True)
    text = "".join(lines[:line] + ["  K: [64]\n"] + lines[line:])
    e = spec_error(tmp_path, text, "<yaml>", line + 1)
    assert "duplicate key 'K'" in e.reason


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path, text):
    e = spec_error(tmp_path, text, "<top>", None)
    assert "mapping" in e.reason
    if text.startswith("-"):
        assert e.line == 1


def test_empty_file(tmp_path):
    spec_error(tmp_path, "", "<top>", None)


def test_unreadable_file(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_spec_file(tmp_path / "missing.yaml")
    assert ei.value.key == "<file>" and "missing.yaml" in str(ei.value)


def test_unknown_top_level_key(tmp_path):
    text = GDN_TEXT + "bogus: 1\n"
    e = spec_error(tmp_path, text, "bogus", len(GDN_LINES) + 1)
    assert "unknown key" in e.reason


@pytest.mark.parametrize("key", ["name", "template", "kernel_name", "params", "tunables", "rules", "launch", "args"])
def test_required_key_missing(tmp_path, key):
    doc = gdn_doc()
    del doc[key]
    e = spec_error(tmp_path, dump(doc), key, 1)
    assert "required key is missing" in e.reason


@pytest.mark.parametrize("key", ["name", "template", "kernel_name"])
@pytest.mark.parametrize("value", ["''", "[a]", "3"])
def test_string_keys_must_be_nonempty_strings(tmp_path, key, value):
    line = section(GDN_TEXT, key)[0]
    spec_error(tmp_path, set_line(GDN_TEXT, line, f"{key}: {value}"), key, line)


def test_kernel_name_not_identifier(tmp_path):
    line = section(GDN_TEXT, "kernel_name")[0]
    spec_error(tmp_path, set_line(GDN_TEXT, line, "kernel_name: gdn-step"), "kernel_name", line)


def test_template_not_found(tmp_path):
    line = section(GDN_TEXT, "template")[0]
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, "template: nope.cu.j2"), "template", line)
    assert "nope.cu.j2" in e.reason


@pytest.mark.parametrize(
    "template,reason",
    [
        # every expansion must exist: the first missing one is named with its values
        ('"gdn_{layout}.cu.j2"', "no template named 'gdn_klast.cu.j2' (for layout='klast')"),
        ('"{form}_{layout}.cu.j2"', "no template named 'recurrent_klast.cu.j2' (for form='recurrent', layout='klast')"),
        # placeholders name params or tunables only
        ('"gdn_{bogus}.cu.j2"', "placeholder {bogus} is not a param or tunable"),
        ('"gdn_{vec}.cu.j2"', "placeholder {vec} is not a param or tunable"),  # a derived value
        ('"gdn_{K}"', "no template named 'gdn_64' (for K=64)"),
        ('"gdn_{}.cu.j2"', "expected {name}"),
        ('"gdn_{0}.cu.j2"', "expected {name}"),
        ('"gdn_{form!r}.cu.j2"', "placeholder {form!r}: expected {name}"),
        ('"gdn_{form:>9}.cu.j2"', "placeholder {form:>9}: expected {name}"),
        ('"gdn_{form.x}.cu.j2"', "expected {name}"),
        ('"gdn_{form.cu.j2"', "gdn_{form.cu.j2"),
        ('"gdn_}form{.cu.j2"', "gdn_}form{.cu.j2"),
    ],
)
def test_template_placeholders(tmp_path, template, reason):
    line = section(GDN_TEXT, "template")[0]
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, f"template: {template}"), "template", line)
    assert reason in e.reason


def test_template_placeholder_expansion(tmp_path):
    """A placeholder may name a param as well as a tunable, and the same name twice; values are formatted with
    str() ({pool} -> True / False); braces doubled are literal."""
    from gdnjit import render as grender

    real = grender.template_exists
    made = {"g_True_bf16.cu.j2", "g_False_bf16.cu.j2", "g_True_fp16.cu.j2", "g_False_fp16.cu.j2", "g_{x}_recurrent.cu.j2",
            "g_{x}_chunk.cu.j2", "g_{x}_mma.cu.j2", "g_{x}_tc.cu.j2"}
    line = section(GDN_TEXT, "template")[0]
    import unittest.mock

    with unittest.mock.patch.object(grender, "template_exists", lambda n: n in made or real(n)):
        path = tmp_path / "gdn.yaml"
        path.write_text(set_line(GDN_TEXT, line, 'template: "g_{pool}_{in_dtype}.cu.j2"'))
        spec = load_spec_file(path)
        assert spec.template_fields == ("pool", "in_dtype")
        assert spec.template_for({"pool": True, "in_dtype": "fp16", "K": 64}) == "g_True_fp16.cu.j2"
        assert {t for _, t in spec.template_expansions()} == {t for t in made if t.startswith("g_T") or t.startswith("g_F")}
        path.write_text(set_line(GDN_TEXT, line, 'template: "g_{{x}}_{form}.cu.j2"'))
        spec = load_spec_file(path)
        assert spec.template_fields == ("form",) and spec.template_for({"form": "tc"}) == "g_{x}_tc.cu.j2"
        path.write_text(set_line(GDN_TEXT, line, 'template: "g_{pool}_{in_dtype}_{pool}.cu.j2"'))
        e = spec_error(tmp_path, path.read_text(), "template", line)
        assert "g_False_bf16_False.cu.j2" in e.reason


def test_variant_template_follows_the_form():
    from gdnjit.variant import Variant

    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    p.update(K=128, V=128, T=4)
    t = _tun(lanes_per_row=4, ilp=1, tile_v=32, stage=True, form="mma")
    v = Variant.make(spec, p, t, "sm_90")
    assert v.template == "gdn_mma.cu.j2" and v.key_fields["template"] == "gdn_mma.cu.j2"
    w = Variant.make(spec, p, _tun(lanes_per_row=4, ilp=1, tile_v=32, stage=True, form="recurrent"), "sm_90")
    assert w.template == "gdn_recurrent.cu.j2" and w.key_fields["template_hash"] != v.key_fields["template_hash"]


# ---- params / tunables -----------------------------------------------------------------------


@pytest.mark.parametrize("table,name", [("params", "K"), ("tunables", "ilp")])
@pytest.mark.parametrize(
    "value,reason",
    [
        ("64", "non-empty list"),
        ("[]", "non-empty list"),
        ("{a: 1}", "non-empty list"),
        ("null", "non-empty list"),
        ("[[64], 128]", "scalars"),
        ("[{a: 1}]", "scalars"),
        ("[null]", "scalars"),
        ("[64, 128, 64]", "duplicate"),
    ],
)
def test_values_table_errors(tmp_path, table, name, value, reason):
    line = key_line(GDN_TEXT, table, name)
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, f"{name}: {value}"), f"{table}.{name}", line)
    assert reason in e.reason


@pytest.mark.parametrize("table", ["params", "tunables"])
@pytest.mark.parametrize("value", [[1, 2], {}, None, "x"])
def test_values_table_not_a_mapping(tmp_path, table, value):
    doc = gdn_doc()
    doc[table] = value
    text = dump(doc)
    e = spec_error(tmp_path, text, table, section(text, table)[0])
    assert "non-empty mapping" in e.reason


def test_value_name_not_identifier(tmp_path):
    line = key_line(GDN_TEXT, "params", "K")
    spec_error(tmp_path, set_line(GDN_TEXT, line, "K-dim: [64, 128, 256]"), "params.K-dim", line)


def test_name_clash_param_tunable(tmp_path):
    line = key_line(GDN_TEXT, "tunables", "ilp")
    lines = GDN_TEXT.splitlines(keepends=True)
    text = "".join(lines[:line] + ["  K: [64]\n"] + lines[line:])
    e = spec_error(tmp_path, text, "tunables", section(GDN_TEXT, "tunables")[0])
    assert "['K']" in e.reason and "both param and tunable" in e.reason


# ---- derived / facts / constraints --------------------------------------------------------------


@pytest.mark.parametrize(
    "new,reason",
    [
        ('elems: "K //"', "syntax error"),
        ('elems: "K // (lanes_per_row"', "syntax error"),
        ('elems: "K // lanes_per_rowz"', "unknown names ['lanes_per_rowz']"),
        ('elems: "K // n_tiles"', "unknown names ['n_tiles']"),  # defined later: order matters
        ('elems: "K // B"', "unknown names ['B']"),  # facts are runtime-only
        ('elems: ""', "non-empty expression"),
        ("elems: [1]", "expression string"),
        ("elems: 1.5", "expression string"),
        ("elems: true", "expression string"),
    ],
)
def test_derived_errors(tmp_path, new, reason):
    line = key_line(GDN_TEXT, "derived", "elems")
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, new), "derived.elems", line)
    assert reason in e.reason, e.reason


def test_derived_shadows_param(tmp_path):
    line = key_line(GDN_TEXT, "derived", "elems")
    spec_error(tmp_path, set_line(GDN_TEXT, line, 'K: "64"'), "derived.K", line)


def test_derived_not_a_mapping(tmp_path):
    doc = gdn_doc()
    doc["derived"] = ["a"]
    text = dump(doc)
    spec_error(tmp_path, text, "derived", section(text, "derived")[0])


@pytest.mark.parametrize("new", ["facts: B", "facts: [B, 1]", "facts: [B, not-an-id]", "facts: [B, K]"])
def test_facts_errors(tmp_path, new):
    line = section(GDN_TEXT, "facts")[0]
    spec_error(tmp_path, set_line(GDN_TEXT, line, new), "facts", line)


C_LAST = len(GDN["constraints"]) - 1
C_LAST_LINE = item_lines(GDN_TEXT, "constraints")[C_LAST]


def test_constraint_unknown_name(tmp_path):
    text = set_line(GDN_TEXT, C_LAST_LINE, 'expr: "n_tile >= 1"')
    e = spec_error(tmp_path, text, f"constraints[{C_LAST}]", C_LAST_LINE)
    assert "unknown names ['n_tile']" in e.reason


def test_constraint_fact_is_unknown(tmp_path):
    """Constraints are checked at compile time: runtime facts are not available to them."""
    text = set_line(GDN_TEXT, C_LAST_LINE, 'expr: "n_tiles >= B"')
    e = spec_error(tmp_path, text, f"constraints[{C_LAST}]", C_LAST_LINE)
    assert "['B']" in e.reason


def test_constraint_syntax_error(tmp_path):
    text = set_line(GDN_TEXT, C_LAST_LINE, 'expr: "n_tiles >="')
    e = spec_error(tmp_path, text, f"constraints[{C_LAST}].expr", C_LAST_LINE)
    assert "syntax error" in e.reason


@pytest.mark.parametrize("new", ['- {why: no expr}', '- {expr: "1", why: x, extra: 1}', "- just a string"])
def test_constraint_shape(tmp_path, new):
    lines = GDN_TEXT.splitlines(keepends=True)
    i = C_LAST_LINE - 1
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    text = "".join(lines[:i] + [indent + new + "\n"] + lines[i:])
    spec_error(tmp_path, text, f"constraints[{C_LAST}]", C_LAST_LINE)


def test_constraints_not_a_list(tmp_path):
    doc = gdn_doc()
    doc["constraints"] = {"expr": "1"}
    text = dump(doc)
    spec_error(tmp_path, text, "constraints", section(text, "constraints")[0])


# ---- rules ----------------------------------------------------------------------------------


def test_rule_unknown_tunable(tmp_path):
    text = set_line(GDN_TEXT, R_USE_LINE, "use: " + flow({**R_USE, "warps": 4}))
    e = spec_error(tmp_path, text, f"rules[{R}].use", R_USE_LINE)
    assert "exactly the tunables" in e.reason


def test_rule_missing_tunable(tmp_path):
    use = {k: v for k, v in R_USE.items() if k != "ilp"}
    spec_error(tmp_path, set_line(GDN_TEXT, R_USE_LINE, "use: " + flow(use)), f"rules[{R}].use", R_USE_LINE)


def test_rule_use_not_a_mapping(tmp_path):
    text = set_line(GDN_TEXT, R_USE_LINE, "use: " + flow(list(R_USE.values())))
    spec_error(tmp_path, text, f"rules[{R}].use", R_USE_LINE)


@pytest.mark.parametrize("bad", [3, "2", 2.5, None])
def test_rule_disallowed_value(tmp_path, bad):
    assert bad not in ILP_ALLOWED
    text = set_line(GDN_TEXT, R_USE_LINE, "use: " + flow({**R_USE, "ilp": bad}))
    e = spec_error(tmp_path, text, f"rules[{R}].use.ilp", R_USE_LINE)
    assert f"not an allowed value {ILP_ALLOWED}" in e.reason


def test_rule_disallowed_value_block_style(tmp_path):
    """The line is the offending key's own line when ``use`` is a block mapping."""
    use = {**R_USE, "ilp": 3}
    lines = GDN_TEXT.splitlines(keepends=True)
    i = R_USE_LINE - 1
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    block = [indent + "use:\n"] + [f"{indent}  {k}: {flow([v])[1:-1]}\n" for k, v in use.items()]
    text = "".join(lines[:i] + block + lines[i + 1:])
    spec_error(tmp_path, text, f"rules[{R}].use.ilp", R_USE_LINE + 1 + list(use).index("ilp"))


@pytest.mark.parametrize(
    "when,reason",
    [
        ("\"layout == 'klast' and KK == 256\"", "unknown names ['KK']"),
        ("\"layout == 'klast' and lanes_per_rowx == 1\"", "unknown names ['lanes_per_rowx']"),
        ("\"layout == 'klast' and\"", "syntax error"),
        ("\"layout == 'klast' and B | nofilter\"", "No filter named 'nofilter'"),  # the code generator's
        ("\"B is nosuchtest\"", "No test named 'nosuchtest'"),  # errors, also found at load
        ("[1]", "expression string"),
        ("1.5", "expression string"),
    ],
)
def test_rule_when_errors(tmp_path, when, reason):
    text = set_line(GDN_TEXT, R_WHEN_LINE, f"when: {when}")
    e = spec_error(tmp_path, text, f"rules[{R}].when", R_WHEN_LINE)
    assert reason in e.reason, e.reason


def test_rule_when_may_use_facts_and_derived(tmp_path):
    text = set_line(GDN_TEXT, R_WHEN_LINE, 'when: "HV > H and num_warps >= 1 and B > 0 and num_sms > 0"')
    load_spec_file(write(tmp_path, text))


@pytest.mark.parametrize("new", ["- [1]", "- {why: no use}", "- {use: {}, bogus: 1}"])
def test_rule_shape(tmp_path, new):
    lines = GDN_TEXT.splitlines(keepends=True)
    i = item_lines(GDN_TEXT, "rules")[R] - 1
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    text = "".join(lines[:i] + [indent + new + "\n"] + lines[i:])
    spec_error(tmp_path, text, f"rules[{R}]", i + 1)


@pytest.mark.parametrize("value", [[], {}, "x"])
def test_rules_not_a_list(tmp_path, value):
    doc = gdn_doc()
    doc["rules"] = value
    text = dump(doc)
    spec_error(tmp_path, text, "rules", section(text, "rules")[0])


def test_no_fallback_rule(tmp_path):
    doc = gdn_doc()
    doc["rules"] = [r for r in doc["rules"] if "when" in r]
    text = dump(doc)
    e = spec_error(tmp_path, text, "rules", item_lines(text, "rules")[0])
    assert "without `when`" in e.reason


def test_fallback_invalid_for_some_params(tmp_path):
    """Drop the last fallback (K-major, bf16 state, K = 256): that combination has none left."""
    doc = gdn_doc()
    last = max(i for i, r in enumerate(doc["rules"]) if "when" not in r)
    del doc["rules"][last]
    text = dump(doc)
    e = spec_error(tmp_path, text, "rules", item_lines(text, "rules")[0])
    assert "no fallback rule" in e.reason
    assert "layout='kmajor'" in e.reason and "K=256" in e.reason and "state_dtype='bf16'" in e.reason


def test_fallback_check_refuses_to_enumerate_millions(tmp_path):
    """A constraint over many params that no fallback's tunables settle alone would make the fallback check walk
    their whole product (billions for gdn's params: the loader hung on such a fuzzed spec): refused, naming the count."""
    doc = gdn_doc()
    names = [n for n in ("T", "in_dtype", "out_dtype", "dtb_dtype", "pool", "idx_dtype", "update", "l2norm", "varlen",
                         "tree", "gates") if n in doc["params"]]
    doc["constraints"].append({"expr": " and ".join(f"{n} == {n}" for n in names), "why": "reads many params"})
    text = dump(doc)
    e = spec_error(tmp_path, text, "rules", item_lines(text, "rules")[0])
    assert "checking the fallback rules would enumerate" in e.reason and "(at most 4096)" in e.reason


def test_single_klast_only_fallback(tmp_path):
    """A single fallback that only suits K-last is rejected naming a K-major combination."""
    doc = gdn_doc()
    first = next(r for r in doc["rules"] if "when" not in r)
    doc["rules"] = [r for r in doc["rules"] if "when" in r] + [first]
    e = spec_error(tmp_path, dump(doc), "rules", None)
    assert "layout='kmajor'" in e.reason


# ---- launch / args -------------------------------------------------------------------------


@pytest.mark.parametrize("drop", ["grid", "block", "smem"])
def test_launch_missing_key(tmp_path, drop):
    doc = gdn_doc()
    del doc["launch"][drop]
    text = dump(doc)
    e = spec_error(tmp_path, text, "launch", section(text, "launch")[0])
    assert "grid, block, smem" in e.reason


def test_launch_extra_key(tmp_path):
    doc = gdn_doc()
    doc["launch"]["cluster"] = "1"
    text = dump(doc)
    spec_error(tmp_path, text, "launch", section(text, "launch")[0])


def test_launch_unknown_name(tmp_path):
    line = key_line(GDN_TEXT, "launch", "grid")
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, 'grid: "B * HVV * n_tiles"'), "launch.grid", line)
    assert "['HVV']" in e.reason


def test_launch_syntax_error(tmp_path):
    line = key_line(GDN_TEXT, "launch", "block")
    spec_error(tmp_path, set_line(GDN_TEXT, line, 'block: "num_warps *"'), "launch.block", line)


@pytest.mark.parametrize(
    "name,new",
    [("q", "pointer"), ("B", "i16"), ("scale", "f64"), ("pool_size", "64"), ("a", "[ptr]"), ("k", "null")],
)
def test_args_bad_type(tmp_path, name, new):
    line = key_line(GDN_TEXT, "args", name)
    e = spec_error(tmp_path, set_line(GDN_TEXT, line, f"{name}: {new}"), f"args.{name}", line)
    assert "ptr" in e.reason and "i64" in e.reason


@pytest.mark.parametrize("value", [[], {}, ["q"]])
def test_args_not_a_mapping(tmp_path, value):
    doc = gdn_doc()
    doc["args"] = value
    text = dump(doc)
    spec_error(tmp_path, text, "args", section(text, "args")[0])


# ---- expressions ------------------------------------------------------------------------------


def test_expr_basics():
    assert gexpr.evaluate("K // lanes_per_row", {"K": 128, "lanes_per_row": 8}) == 16
    assert gexpr.evaluate("4 if s == 'fp32' else 8", {"s": "bf16"}) == 8
    assert gexpr.evaluate("min(a, b) + max(a, b) + abs(-1)", {"a": 2, "b": 3}) == 6
    assert gexpr.names_in("min(K, V) // lanes_per_row") == {"K", "V", "lanes_per_row"}
    with pytest.raises(gexpr.ExprError, match="undefined"):
        gexpr.evaluate("K + 1", {})
    with pytest.raises(gexpr.ExprError, match="ZeroDivisionError"):
        gexpr.evaluate("K // 0", {"K": 1})
    with pytest.raises(gexpr.ExprError, match="syntax error"):
        gexpr.compile_expr("K +")
    with pytest.raises(gexpr.ExprError):
        gexpr.compile_expr("   ")



# Texts whose compile fails after the parse (in Jinja's code generator or constant folding, or in Python's
# compile: "max(1, a=1, a=2)"), next to plain ones: check_expr must refuse each exactly as compile_expr does.
CHECK_EXPR_CASES = [
    "K // lanes_per_row", "x", "self", "self.x", "-1", "48 * 1024 * 4", "x + -1", "not 0", "(1, 2)", "[1, [2, x]]",
    "x[1:2]", "x[:]", "1[0]", "'a' * 3", "10 ** 9999", "10 ** 99 * x", "9999999999 * 99999999999 * x", "1e400 * 1",
    "{[1]: 2}", "{x: 1}", "x | nofilter", "x | int", "x | default(1)", "x is defined", "x is nosuchtest",
    "1 if true else x | nofilter", "x if y", "max(1, if=2)", "max(1, a=1, a=2)", "max(x, key=y)", "f(*a)", "f(**k)",
    "x + " * 40 + "x", "(" * 40 + "x" + ")" * 40, "(" * 200 + "x" + ")" * 200, "a, b", "x }} {{ y", "{% if %}",
    "'}}' ~ x", "[x for x in y]", "x.__class__", "range(10)", "lipsum()", "x.if", "K //", "", "   ", "a and", "1e400",
    "K\x00", "é + 1",
]


def test_expr_evaluates_while_another_thread_imports_jinja2(monkeypatch):
    """A fast-path expression does not look at jinja2: while another thread's ``import jinja2`` is under way,
    sys.modules holds a partial module without ``Undefined`` (seen as an AttributeError in tools/compare_sass.py's threads)."""
    import types

    monkeypatch.setitem(sys.modules, "jinja2", types.ModuleType("jinja2"))  # partial: no attributes yet
    text = "K * 3 + lanes_per_row"
    assert isinstance(gexpr.compile_expr(text), gexpr._FastExpr)
    assert gexpr._evaluate(text, {"K": 128, "lanes_per_row": 8}) == 392
    with pytest.raises(gexpr.ExprError, match="ZeroDivisionError"):
        gexpr._evaluate("K // lanes_per_row", {"K": 1, "lanes_per_row": 0})


@pytest.mark.parametrize("text", CHECK_EXPR_CASES)
def test_check_expr_refuses_exactly_what_compile_expr_refuses(text):
    """Loading checks expressions with check_expr (a parse, and a compile only where the parse cannot decide)
    and compiles them at first use: every text compile_expr refuses must be refused at load, with the same
    error, and the free names must be what Jinja's own analysis finds. (tests/test_fuzz.py: random texts.)"""
    def outcome(fn):
        fn.cache_clear()
        try:
            return "ok", fn(text)
        except Exception as e:  # noqa: BLE001 - the same exception, whatever it is
            return type(e).__name__, str(e)
    checked, compiled = outcome(gexpr.check_expr), outcome(gexpr.compile_expr)
    assert checked[0] == compiled[0], (checked, compiled)
    if checked[0] == "RecursionError":  # the parse's recursion: where it stops (the message) varies
        return
    if checked[0] == "ok":
        import jinja2.meta
        ast = _jinja_env().parse("{{ " + text + " }}")
        assert checked[1] == set(jinja2.meta.find_undeclared_variables(ast)) - set(_jinja_env().globals)
    else:
        assert checked == compiled


def test_wave_fill_pct_is_the_integer_wave_test():
    """The rules' wave-fill helper (docs/perf.md v16b, v16d) equals the integer form it replaced, 10 n < 9 s ceil(n / s),
    on every n, s in range, and is a builtin (not a free name) of the expressions."""
    for n in range(0, 1100):
        for s in (1, 7, 114, 132, 144):
            pct = gexpr.evaluate("wave_fill_pct(n, s)", {"n": n, "s": s})
            assert (pct < 90) == (10 * n < 9 * s * ((n + s - 1) // s)), (n, s)
            assert 0 <= pct <= 100
    assert gexpr.wave_fill_pct(144, 132) == 54 and gexpr.wave_fill_pct(256, 132) == 96 and gexpr.wave_fill_pct(0, 132) == 100
    assert gexpr.names_in("wave_fill_pct(B * HV, num_sms) < 90") == {"B", "HV", "num_sms"}
    with pytest.raises(ValueError, match="slots must be positive"):
        gexpr.wave_fill_pct(4, 0)


def test_expr_memo_keys_on_the_free_names_values_and_types():
    # the memo reuses a result only for equal values of equal types of the names the text reads
    assert gexpr.evaluate("x / 2", {"x": 3, "unrelated": 1}) == 1.5
    assert gexpr.evaluate("x / 2", {"x": 5, "unrelated": 1}) == 2.5
    assert gexpr.evaluate("x ~ ''", {"x": 1}) == "1"
    assert gexpr.evaluate("x ~ ''", {"x": 1.0}) == "1.0"  # 1 == 1.0 and hash alike
    assert gexpr.evaluate("x ~ ''", {"x": True}) == "True"
    assert gexpr.evaluate("len(x)", {"x": [1, 2, 3]}) == 3  # unhashable: evaluated without the memo
    assert gexpr.evaluate("len(x)", {"x": [1]}) == 1
    first = gexpr.evaluate("[x, x]", {"x": 2})
    first.append(3)  # a caller changing a list result does not change the next call's
    assert gexpr.evaluate("[x, x]", {"x": 2}) == [2, 2]
    gexpr.evaluate("y + 1", {"y": 1})
    with pytest.raises(gexpr.ExprError, match="undefined"):  # a missing name is not served from the memo
        gexpr.evaluate("y + 1", {})
    for _ in range(2):  # errors are raised every time, never memoised
        with pytest.raises(gexpr.ExprError, match="ZeroDivisionError"):
            gexpr.evaluate("1 // y", {"y": 0})


@pytest.mark.parametrize("text, parts", [
    ("T == 2 and layout == 'klast' and B * HV < 1024", ("T == 2", "layout == 'klast'", "B * HV < 1024")),
    ("(a and b) and c", ("(a and b)", "c")),
    ("not a and b", ("not a", "b")),
    ("'x and y' == s and t", ("'x and y' == s", "t")),
    ("band and android", ("band", "android")),
    ("a and b or c", None),          # `or` binds looser: one piece
    ("x if a and b else y", None),   # so does the conditional expression
    ("a and", None),                 # a piece that does not compile alone: the whole text reports the error
])
def test_expr_splits_top_level_and_chains(text, parts):
    assert gexpr.conjuncts(text) == (parts or (text,))


def test_expr_and_chains_evaluate_like_jinja():
    """Operand by operand: the first falsy operand's value, else the last one's, and later operands are not
    evaluated (nor their errors raised) after a falsy one; the same as one Jinja call, over every shipped
    spec expression too (tests/test_dispatch.py checks the dispatcher's choices)."""
    assert gexpr.evaluate("a and b and c", {"a": 1, "b": 0, "c": 2}) == 0
    assert gexpr.evaluate("a and b and c", {"a": 1, "b": 3, "c": 2}) == 2
    assert gexpr.evaluate("a and b and c", {"a": [], "b": 3, "c": 2}) == []
    assert gexpr.evaluate("x > 0 and 1 // x > 0", {"x": 0}) is False  # the division is never evaluated
    with pytest.raises(gexpr.ExprError, match="ZeroDivisionError"):
        gexpr.evaluate("x >= 0 and 1 // x > 0", {"x": 0})
    with pytest.raises(gexpr.ExprError, match="undefined"):
        gexpr.evaluate("x > 0 and y", {"x": 1})
    spec = get_spec("gdn")
    rnd = random.Random(5)
    allowed = {n: spec.allowed(n) for n in spec.param_names}
    texts = [r.when for r in spec.rules if r.when] + [c.expr for c in spec.constraints]
    assert any(len(gexpr.conjuncts(t)) > 1 for t in texts)
    checked = 0
    for _ in range(300):
        ctx = {n: rnd.choice(v) for n, v in allowed.items()}
        ctx.update({n: rnd.choice(spec.allowed(n)) for n, _ in spec.tunables})
        ctx.update(B=rnd.choice([1, 2, 4, 8, 32, 512]), H=16, HV=rnd.choice([16, 32, 64]), num_sms=132)
        try:
            for n, e in spec.derived:
                ctx[n] = gexpr.evaluate(e, ctx)
        except gexpr.ExprError:  # an invalid tunable combination (e.g. 0 warps): no variant has it
            continue
        for t in texts:
            try:
                want = gexpr.compile_expr(t)(**ctx)
            except ZeroDivisionError:
                with pytest.raises(gexpr.ExprError, match="ZeroDivisionError"):
                    gexpr.evaluate(t, ctx)
            else:
                assert gexpr.evaluate(t, ctx) == want, t
            checked += 1
    assert checked > 1000

def test_conjunction_decides_as_evaluate_does():
    """expr.conjunction (one compiled Python expression over expr.scope) holds exactly where every part evaluates
    truthy, over the shipped specs' rule and retile conditions on random contexts; a part that fails raises evaluate's
    ExprError naming it; a part outside the common subset (Jinja's) is evaluated by evaluate."""
    for args in [(("x > 0", "1 // x > 0"), {"x": 0}, False), (("a", "b"), {"a": 1, "b": []}, False),
                 (("a", "b"), {"a": 1, "b": 2}, True), ((), {}, True), (("min(a, 3) == 3",), {"a": 4}, True),
                 (("x is defined", "x > 1"), {"x": 2}, True), (("x is defined", "x > 1"), {}, False),
                 (("s == 'a # b'",), {"s": "a # b"}, True)]:
        parts, ctx, want = args
        assert gexpr.conjunction(parts)(gexpr.scope(ctx)) is want, args
    assert gexpr.conjunction(("x is defined",)).code is None and gexpr.conjunction(("x > 1", "y")).code is not None
    with pytest.raises(gexpr.ExprError, match=r"'1 // x > 0'.*ZeroDivisionError"):
        gexpr.conjunction(("x >= 0", "1 // x > 0"))(gexpr.scope({"x": 0}))
    with pytest.raises(gexpr.ExprError, match=r"'y'.*undefined"):
        gexpr.conjunction(("x > 0", "y"))(gexpr.scope({"x": 1}))
    spec = get_spec("gdn")
    rnd = random.Random(11)
    allowed = {n: spec.allowed(n) for n in spec.param_names}
    texts = [r.when for r in spec.rules if r.when] + [r.when for r in spec.retile]
    checked = held = 0
    for _ in range(300):
        ctx = {n: rnd.choice(v) for n, v in allowed.items()}
        ctx.update({n: rnd.choice(spec.allowed(n)) for n, _ in spec.tunables})
        ctx.update(B=rnd.choice([1, 2, 4, 8, 32, 100, 512, 4096]), H=16, HV=rnd.choice([16, 32, 48, 64]),
                   num_sms=rnd.choice([78, 132, 148]))
        for t in texts:
            for parts in (gexpr.conjuncts(t), gexpr.conjuncts(t)[1:]):
                try:
                    want = all(gexpr.evaluate(p, ctx) for p in parts)
                except gexpr.ExprError as e:
                    with pytest.raises(gexpr.ExprError, match=re.escape(str(e))):
                        gexpr.conjunction(parts)(gexpr.scope(ctx))
                else:
                    assert gexpr.conjunction(parts)(gexpr.scope(ctx)) is want, (t, parts)
                    held += want
                checked += 1
    assert checked > 10000 and held > 100


@pytest.mark.parametrize(
    "text,context",
    [
        ("().__class__.__bases__", {}),
        ("().__class__.__bases__[0].__subclasses__()", {}),
        ("x.__globals__", {"x": lambda: 0}),
        ("x.__globals__['__builtins__']", {"x": lambda: 0}),
        ("x.__class__", {"x": 1}),
        ("x.__code__", {"x": lambda: 0}),
        ("min.__self__", {}),
        ("x.mro()", {"x": int}),
        ("x.gi_frame", {"x": (i for i in ())}),
        ("x.append(1)", {"x": []}),
        ("x.update(a=1)", {"x": {}}),
        ("''.__class__.__mro__", {}),
        ("lipsum.__globals__", {}),
    ],
)
def test_expr_sandboxed(text, context):
    with pytest.raises(gexpr.ExprError):
        gexpr.evaluate(text, context)


def test_expr_sandbox_does_not_mutate():
    x: list = []
    with pytest.raises(gexpr.ExprError):
        gexpr.evaluate("x.append(1)", {"x": x})
    assert x == []


def test_expr_number_literals_past_the_float_range_are_errors():
    """Jinja writes a float past the float range as the name `inf`, which no context defines: a literal such as 1e400
    is refused when checked (a spec naming it fails to load), and a constant Jinja folds past the range is an ExprError
    when evaluated, not a NameError (found by tests/test_fuzz.py's spec loader: a `dispatch_params` entry `1E400`)."""
    for text in ("1E400", "int(1E400)", "-1e400 < x", "x + 1e999", "[1e400][0]"):
        with pytest.raises(gexpr.ExprError, match="past the float range"):
            gexpr.check_expr(text)
        with pytest.raises(gexpr.ExprError, match="past the float range"):
            gexpr.evaluate(text, {"x": 1})
    with pytest.raises(gexpr.ExprError, match="float range"):
        gexpr.evaluate("[x, 1e308 * 10][0]", {"x": 1})
    assert gexpr.evaluate("1e308 * 10", {}) == float("inf")  # Python's arithmetic (the common subset): inf


def test_expr_sandbox_range_limit_is_expr_error():
    with pytest.raises(gexpr.ExprError):
        gexpr.evaluate("range(n) | list | length", {"n": 10**6})


def test_sandboxed_expression_in_spec_is_not_python(tmp_path):
    """A derived expression reaching for internals never yields them: every variant is invalid,
    and validation names the derived value."""
    line = key_line(GDN_TEXT, "derived", "elems")
    lines = GDN_TEXT.splitlines(keepends=True)
    text = "".join(lines[:line] + ['  leak: "K.__class__"\n'] + lines[line:])
    e = spec_error(tmp_path, text, "derived.leak", line + 1)
    assert "fails to evaluate" in e.reason and "expression 'K.__class__' evaluated to undefined" in e.reason


# ---- Spec.violations -----------------------------------------------------------------------


def _params(**kw):
    spec = get_spec("gdn")
    p = {n: v[0] for n, v in spec.params}
    p.update(kw)
    return p


def _tun(**kw):
    """Tunables: the first allowed value of each (e.g. stage=false), then ``kw``."""
    spec = get_spec("gdn")
    t = {n: v[0] for n, v in spec.tunables}
    t.update(kw)
    return t


def test_violations_valid():
    spec = get_spec("gdn")
    assert spec.violations(_params(K=128, V=128), _tun(lanes_per_row=8, ilp=2, tile_v=32)) == []
    assert spec.violations(_params(layout="kmajor", K=128, V=128), _tun(lanes_per_row=8, ilp=1, tile_v=32)) == []
    # every rule's tunables are at least allowed values
    for r in spec.rules:
        assert all(v in spec.allowed(n) for n, v in r.use)


def test_violations_constraints():
    spec = get_spec("gdn")
    # K=64, 32 lanes/row: 2 elements per lane, not a whole 16-byte fp32 vector
    bad = spec.violations(_params(K=64), _tun(lanes_per_row=32, ilp=1, tile_v=8))
    assert any("elems % vec == 0" in b for b in bad)
    # tile_v larger than V: n_tiles is 0
    bad = spec.violations(_params(K=128, V=64), _tun(lanes_per_row=8, ilp=1, tile_v=128))
    assert any("n_tiles >= 1" in b and "tiles cover V exactly" in b for b in bad)
    # too many state registers per thread
    bad = spec.violations(_params(K=256, V=128), _tun(lanes_per_row=4, ilp=2, tile_v=32))
    assert any("rows_per_thread * elems <= 64" in b for b in bad)


def test_violations_tunable_not_allowed():
    spec = get_spec("gdn")
    bad = spec.violations(_params(), _tun(ilp=3))
    assert bad == [f"tunable ilp must be one of {ILP_ALLOWED}, got 3"]
    t = _tun()
    del t["ilp"]
    bad = spec.violations(_params(), t)
    assert bad and "tunable ilp" in bad[0] and "None" in bad[0]


@pytest.mark.parametrize("name", list_specs())
def test_valid_is_not_violations(name):
    """``Spec.valid`` (first broken constraint, derived values on demand) decides exactly as ``violations``:
    on every rule's tunables and on random candidates, over random params of every shipped spec, plus
    a tunable missing or out of range."""
    spec = get_spec(name)
    rnd = random.Random(11)
    choices = spec.all_tunable_choices()
    uses = [dict(r.use) for r in spec.rules]
    seen = {True: 0, False: 0}
    for i in range(3000):
        params = {n: rnd.choice(v) for n, v in spec.params}
        tunables = dict(rnd.choice(uses) if i % 2 else rnd.choice(choices))
        if i % 97 == 0:
            tunables[rnd.choice(spec.tunable_names)] = 3.5
        if i % 89 == 0:
            del tunables[rnd.choice(spec.tunable_names)]
        want = not spec.violations(params, tunables)
        assert spec.valid(params, tunables) is want, (params, tunables)
        seen[want] += 1
    assert min(seen.values()) > 100


def test_spec_hash_is_memoised_and_equal_specs_hash_alike():
    a, b = get_spec("gdn"), load_spec_file(SPEC_DIR / "gdn.yaml")
    assert a is not b and a == b and hash(a) == hash(b) == hash(a)
    assert hash(get_spec("nvfp4_quantize")) != hash(a)


def test_all_tunable_choices():
    spec = get_spec("gdn")
    choices = spec.all_tunable_choices()
    n = 1
    for _, vals in spec.tunables:
        n *= len(vals)
    assert len(choices) == n == len({tuple(c.items()) for c in choices})
    assert _tun(lanes_per_row=8, ilp=2, tile_v=32) in choices


# ---- dispatch ------------------------------------------------------------------------------

TOY = """\
name: toy
description: toy spec for dispatch tests
template: causal_conv1d_update.cu.j2
kernel_name: toy
params:
  n: [32, 64, 128]
  flag: [false, true]
tunables:
  t: [1, 2, 4]
derived:
  per: "n // t"
constraints:
  - expr: "per >= 32"
    why: at least 32 per thread
facts: [B]
rules:
  - when: "B > 100"
    use: {t: 4}
    why: big
  - when: "B > 10"
    use: {t: 2}
    why: medium
  - use: {t: 1}
    why: fallback
launch: {grid: "B", block: "32", smem: "0"}
args: {x: ptr, rows: i32}
"""


@pytest.fixture
def toy(tmp_path):
    return load_spec_file(write(tmp_path, TOY, "toy.yaml"))


@pytest.mark.parametrize(
    "n,B,rule,t",
    [
        (128, 200, 0, 4),  # first rule holds and is valid
        (64, 200, 1, 2),  # first rule holds but t=4 gives per=16: skipped
        (32, 200, 2, 1),  # both invalid: the fallback
        (128, 50, 1, 2),  # first rule's when is false
        (128, 5, 2, 1),
        (128, 101, 0, 4),
        (128, 100, 1, 2),
    ],
)
def test_select_first_valid_rule(toy, n, B, rule, t):
    tunables, chosen = dispatch.select(toy, {"n": n, "flag": False}, {"B": B})
    assert tunables == {"t": t}
    assert chosen is toy.rules[rule]


def test_select_tuned_takes_precedence(toy):
    tunables, chosen = dispatch.select(toy, {"n": 128, "flag": False}, {"B": 1}, tuned={"t": 4})
    assert tunables == {"t": 4} and chosen is None
    # an invalid tuned entry is ignored
    tunables, chosen = dispatch.select(toy, {"n": 32, "flag": False}, {"B": 1}, tuned={"t": 4})
    assert tunables == {"t": 1} and chosen is toy.rules[2]


def test_select_missing_fact(toy):
    with pytest.raises(gexpr.ExprError):
        dispatch.select(toy, {"n": 128, "flag": False}, {})


def test_select_no_valid_rule(tmp_path):
    """A spec bypassing validation (every rule invalid) gets DispatchError, not a bad variant."""
    toy = load_spec_file(write(tmp_path, TOY, "toy.yaml"))
    broken = dataclasses.replace(toy, rules=toy.rules[:1])
    with pytest.raises(dispatch.DispatchError, match="no rule gives valid tunables"):
        dispatch.select(broken, {"n": 32, "flag": False}, {"B": 200})


TOY_RETILE = TOY.replace("launch:", """dispatch_params:
  flag: "1 == 0"
retile_may_set: [t]
retile:
  - when: "flag and t == 2 and B < 20"
    use: {t: 1}
    why: the hidden mode's own choice
launch:""")


def test_retile_sees_the_calls_own_params_after_rules_and_tuned(tmp_path):
    """dispatch_params hides `flag` from the rules and tuned entries; retile then reads the call's own params, the
    chosen tunables and the facts, and changes only what it names (when the result is valid)."""
    toy = load_spec_file(write(tmp_path, TOY_RETILE, "toy.yaml"))
    assert toy.retile_may_set == ("t",) and len(toy.retile) == 1
    for flag in (False, True):
        assert dispatch.select(toy, {"n": 128, "flag": flag}, {"B": 50})[0] == {"t": 2}  # B >= 20: retile's when false
        assert dispatch.select(toy, {"n": 128, "flag": flag}, {"B": 200})[0] == {"t": 4}  # t == 4: no retile
    tunables, rule = dispatch.select(toy, {"n": 128, "flag": True}, {"B": 15})
    assert tunables == {"t": 1} and rule is toy.rules[1]
    assert dispatch.select(toy, {"n": 128, "flag": False}, {"B": 15})[0] == {"t": 2}
    assert dispatch.select(toy, {"n": 128, "flag": True}, {"B": 1}, tuned={"t": 2}) == ({"t": 1}, None)
    assert dispatch.select_each(toy, {"n": 128, "flag": True}, [{"B": 15}, {"B": 50}]) == [
        ({"t": 1}, toy.rules[1]), ({"t": 2}, toy.rules[1])]
    assert dispatch.explain(toy, {"n": 128, "flag": True}, {"B": 15})[-1] == (
        "retile 0: when `flag and t == 2 and B < 20` APPLIED: {'t': 1}")
    assert dispatch.explain(toy, {"n": 128, "flag": False}, {"B": 15})[-1].endswith("` false")


RETILE_ERRORS = [
    ("retile_may_set: [t]", "retile_may_set: [u]", "retile_may_set", "distinct tunable names"),
    ("retile_may_set: [t]", "retile_may_set: [[], t]", "retile_may_set", "distinct tunable names"),  # (fuzz-found)
    ("    use: {t: 1}\n    why: the hidden", "    use: {t: 3}\n    why: the hidden", "retile[0].use.t", "not an allowed"),
    ("retile_may_set: [t]", "retile_may_set: []", "retile[0].use", "may set only the tunables"),
    ("    use: {t: 1}\n", "    use: {t: 1, 3: 1}\n", "retile[0].use", "may set only the tunables"),  # (fuzz-found)
    ('  - when: "flag and t == 2 and B < 20"', '  - when: "flag and per == 2"', "retile[0].when", "unknown names"),
    ("    use: {t: 1}\n", "", "retile[0]", "keys when and use"),
]


TOY_FIRST = TOY.replace("launch:", """first_launch:
  when: "flag and t > 1"
  params: {flag: false, n: 32}
  pin: [t]
  why: a toy's first launch
launch:""")


def test_first_launch_names_the_launch_before_the_call(tmp_path):
    """The spec key first_launch: where its when holds over a call's params and tunables, the call launches the same
    call with its params set first, the pinned tunables the call's; else nothing (and a spec without the key never);
    the shipped gdn_lazy's record keeps it (the rows form's prep, its window pinned)."""
    from gdnjit.spec import FirstLaunch, recorded_spec

    toy = load_spec_file(write(tmp_path, TOY_FIRST, "toy.yaml"))
    assert toy.first_launch_of({"n": 128, "flag": True}, {"t": 2}) == ({"n": 32, "flag": False}, {"t": 2})
    assert toy.first_launch_of({"n": 128, "flag": True}, {"t": 1}) is None
    assert toy.first_launch_of({"n": 128, "flag": False}, {"t": 4}) is None
    assert load_spec_file(write(tmp_path, TOY, "plain.yaml")).first_launch_of({"n": 64, "flag": True}, {"t": 2}) is None
    assert toy.first_launch.when in toy.expressions()
    lazy_file = SPEC_DIR / "gdn_lazy.yaml"
    recorded = recorded_spec(lazy_file.name, lazy_file.read_bytes())
    assert recorded is not None and recorded.first_launch == load_spec_file(lazy_file).first_launch
    assert isinstance(recorded.first_launch, FirstLaunch) and recorded.first_launch.pin == ("window",)


FIRST_LAUNCH_ERRORS = [
    ("  pin: [t]\n", "", "first_launch", "keys when, params and pin"),
    ("  pin: [t]\n", "  pin: [t]\n  also: 1\n", "first_launch", "keys when, params and pin"),
    ('  when: "flag and t > 1"', '  when: "flag and per > 1"', "first_launch.when", "unknown names"),
    ('  when: "flag and t > 1"', '  when: "flag and B > 1"', "first_launch.when", "unknown names"),
    ("  params: {flag: false, n: 32}", "  params: {}", "first_launch.params", "expected a mapping of param names"),
    ("  params: {flag: false, n: 32}", "  params: {m: 32}", "first_launch.params", "expected a mapping of param names"),
    ("  params: {flag: false, n: 32}", "  params: {n: 48}", "first_launch.params.n", "not an allowed value"),
    ("  params: {flag: false, n: 32}", "  params: {n: []}", "first_launch.params.n", "not an allowed value"),
    ("  pin: [t]", "  pin: [u]", "first_launch.pin", "distinct tunable names"),
    ("  pin: [t]", "  pin: [t, t]", "first_launch.pin", "distinct tunable names"),
    ("  pin: [t]", "  pin: [[], t]", "first_launch.pin", "distinct tunable names"),
    ('  when: "flag and t > 1"', '  when: "flag and t > 3 and t == 8"', "first_launch.when", "never takes"),
]


@pytest.mark.parametrize("base, old, new, key, reason", [(TOY_RETILE, *c) for c in RETILE_ERRORS]
                         + [(TOY_FIRST, *c) for c in FIRST_LAUNCH_ERRORS])
def test_retile_and_first_launch_errors(tmp_path, base, old, new, key, reason):
    text = base.replace(old, new)
    assert text != base
    e = spec_error(tmp_path, text, key, None)
    assert reason in str(e)


# ---- derived values that fail to evaluate; comparisons with values never taken (issue 54) ---------------


def toy_with(old: str, new: str, base: str = TOY) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


@pytest.mark.parametrize("text, reason", [
    ('"4 // 0"', "expression '4 // 0': ZeroDivisionError: integer division or modulo by zero"),
    ("\"'a' + 1\"", "expression \"'a' + 1\": TypeError: can only concatenate str"),
])
def test_derived_that_fails_everywhere_is_named(tmp_path, text, reason):
    """Every variant is invalid: the error names the derived value, its line and the evaluation error (it said
    "no fallback rule (without `when`) is valid for " before)."""
    text = toy_with('  per: "n // t"\n', f'  per: "n // t"\n  x: {text}\n')
    e = spec_error(tmp_path, text, "derived.x", line_of(text, "  x: "))
    assert e.reason.startswith("fails to evaluate with rules[0]'s tunables where the constraints hold: "), e.reason
    assert reason in e.reason, e.reason


def test_derived_that_fails_for_some_params_is_named(tmp_path):
    """n = 32 leaves no valid fallback: the failing derived value is named, with the values it read."""
    text = toy_with('  per: "n // t"\n', '  x: "n // (n - 32)"\n  per: "n // t"\n')
    e = spec_error(tmp_path, text, "derived.x", line_of(text, "  x: "))
    assert e.reason == ("fails to evaluate with rules[2]'s tunables where the constraints hold (n=32): "
                        "expression 'n // (n - 32)': ZeroDivisionError: integer division or modulo by zero"), e.reason


def test_derived_that_fails_for_a_rules_tunables_is_named(tmp_path):
    """A rule with `when` whose tunables alone break a derived value (t = 4: inv) is never valid, and dispatch would
    skip it silently: the fallback is valid everywhere, so only this check finds it. The innermost failing value is
    named (the constraint reads w, which reads inv)."""
    text = toy_with('  per: "n // t"\n', '  per: "n // t"\n  inv: "64 // (t - 4)"\n  w: "inv + n"\n')
    text = toy_with("facts: [B]", '  - expr: "w != 0"\n    why: reads inv\nfacts: [B]', text)
    e = spec_error(tmp_path, text, "derived.inv", line_of(text, "  inv: "))
    assert e.reason.startswith("fails to evaluate with rules[0]'s tunables where the constraints hold (t=4): "
                               "expression '64 // (t - 4)': ZeroDivisionError"), e.reason


TOY_EXCLUDED = toy_with("  t: [1, 2, 4]", "  t: [0, 1, 2, 4]")
TOY_EXCLUDED = toy_with('  per: "n // t"\n', '  inv: "64 // t"\n  per: "n // t"\n', TOY_EXCLUDED)
TOY_EXCLUDED = toy_with("    use: {t: 4}", "    use: {t: 0}", TOY_EXCLUDED)
TOY_EXCLUDED = toy_with("  - use: {t: 1}\n", "  - use: {t: 0}\n    why: excluded\n  - use: {t: 1}\n", TOY_EXCLUDED)
# after `per >= 32`, which fails to evaluate at t = 0: the constraints exclude t = 0 whatever their order
TOY_EXCLUDED = toy_with("facts: [B]", '  - expr: "t > 0"\n    why: no empty threads\nfacts: [B]', TOY_EXCLUDED)


def test_derived_may_fail_where_the_constraints_exclude(tmp_path):
    """inv and per fail at t = 0, which a rule with `when` and a fallback use, but a constraint excludes t = 0:
    the spec loads and dispatch takes the next valid rule."""
    toy = load_spec_file(write(tmp_path, TOY_EXCLUDED, "toy.yaml"))
    assert not toy.valid({"n": 64, "flag": False}, {"t": 0})
    assert dispatch.select(toy, {"n": 64, "flag": False}, {"B": 200}) == ({"t": 2}, toy.rules[1])
    assert dispatch.select(toy, {"n": 64, "flag": False}, {"B": 1}) == ({"t": 1}, toy.rules[3])
    # without that constraint, the same failures are errors naming the first one that is read
    text = toy_with('  - expr: "t > 0"\n    why: no empty threads\n', "", TOY_EXCLUDED)
    e = spec_error(tmp_path, text, "derived.per", line_of(text, "  per: "))
    assert "with rules[0]'s tunables where the constraints hold (n=32, t=0): expression 'n // t'" in e.reason


def test_constraint_that_fails_to_evaluate_is_named(tmp_path):
    text = toy_with("facts: [B]", '  - expr: "\'a\' + n"\n    why: a typo\nfacts: [B]')
    e = spec_error(tmp_path, text, "constraints[1].expr", line_of(text, "'a' + n"))
    assert e.reason.startswith("fails to evaluate with rules[2]'s tunables (n=32): expression \"'a' + n\": TypeError"), \
        e.reason


def test_dispatch_param_that_fails_to_evaluate_is_named(tmp_path):
    """(fuzz-found: a raw ExprError escaped the loader)"""
    text = toy_with('  flag: "1 == 0"', '  flag: "n // (n - 32) == 1"', TOY_RETILE)
    e = spec_error(tmp_path, text, "dispatch_params.flag", line_of(text, '  flag: "n'))
    assert e.reason == ("fails to evaluate for {'n': 32}: expression 'n // (n - 32) == 1': ZeroDivisionError: integer "
                        "division or modulo by zero"), e.reason


CONV_TEXT = (SPEC_DIR / "causal_conv1d_update.yaml").read_text()
CONV_WHEN = "- when: \"contig and acc_dtype == 'none'\""


@pytest.mark.parametrize("when, reason", [
    ("contig and acc_dtype == 'nnone'", "`acc_dtype == 'nnone'` compares acc_dtype with 'nnone'"),
    ("contig and 'nnone' == acc_dtype", "`'nnone' == acc_dtype` compares acc_dtype with 'nnone'"),
    ("acc_dtype != 'nnone'", "`acc_dtype != 'nnone'` compares acc_dtype with 'nnone'"),
    ("acc_dtype in ('none', 'int16')", "compares acc_dtype with 'int16'"),
    ("acc_dtype not in ['none', 'int16']", "compares acc_dtype with 'int16'"),
    ("'none' == acc_dtype == 'int16'", "compares acc_dtype with 'int16'"),  # chained: pair by pair
    ("vec == 3", "compares vec with 3, a value it never takes (allowed: [1, 2, 4, 8])"),  # a tunable
    ("contig == None", "compares contig with None"),
    ("W in (2, -1)", "compares W with -1"),
    ("contig and (\n  acc_dtype == 'nnone')", "`acc_dtype == 'nnone'`"),  # over lines
])
def test_rule_comparing_with_a_value_never_taken(tmp_path, when, reason):
    text = CONV_TEXT.replace(CONV_WHEN, f"- when: {json.dumps(when)}")
    line = line_of(text, "- when: ")
    e = spec_error(tmp_path, text, "rules[0].when", line)
    assert reason in e.reason, e.reason
    assert "a value it never takes (allowed: [" in e.reason and "\n" not in str(e)


def test_acc_dtype_typo_message(tmp_path):
    """The whole message: file, line, key, the comparison, the name, the literal, the allowed values."""
    text = CONV_TEXT.replace(CONV_WHEN, '- when: "contig and acc_dtype == \'nnone\'"')
    line = line_of(text, "- when: ")
    e = spec_error(tmp_path, text, "rules[0].when", line)
    assert str(e) == (f"{tmp_path / 'bad.yaml'}:{line}: rules[0].when: `acc_dtype == 'nnone'` compares acc_dtype with "
                      "'nnone', a value it never takes (allowed: ['none', 'int32', 'int64'])")


def test_param_domain_values_may_be_compared(tmp_path):
    """T lists 1..8 but its domain takes 1..64: 60 is a value T takes, 100 is not."""
    load_spec_file(write(tmp_path, CONV_TEXT.replace(CONV_WHEN, '- when: "contig and T in (4, 60)"')))
    text = CONV_TEXT.replace(CONV_WHEN, '- when: "contig and T in (4, 100)"')
    e = spec_error(tmp_path, text, "rules[0].when", line_of(text, "- when: "))
    assert "compares T with 100, a value it never takes (allowed: [1, 2, 3, 4, 5, 6, 7, 8] or an integer with " \
           "1 <= T <= 64)" in e.reason, e.reason


@pytest.mark.parametrize("when", [
    "acc_dtype == 'none' and B == 7",  # a fact: no list
    "spec_decode == 'yes'",  # a derived value: not read
    "W < 100 and T > 1000",  # orderings are not read
    "contig == 1",  # 1 == True
    "W == 2.0",
    "T == 60.0 or T in (True, 2)",  # equal to integers T's domain takes
    "'int' in acc_dtype",  # the value's contents
    "acc_dtype == none",  # Jinja's none: a name to Python, not a literal
    "acc_dtype == 'nnone' and B is divisibleby 3",  # Jinja's own syntax: not read
])
def test_comparisons_not_read_still_load(tmp_path, when):
    load_spec_file(write(tmp_path, CONV_TEXT.replace(CONV_WHEN, f"- when: {json.dumps(when)}")))


@pytest.mark.parametrize("old, new, key, needle, reason", [
    ('  - when: "flag and t == 2 and B < 20"', '  - when: "flag and t == 3 and B < 20"', "retile[0].when",
     '  - when: "flag and', "`t == 3` compares t with 3"),
    ('  flag: "1 == 0"', '  flag: "n == 33"', "dispatch_params.flag", '  flag: "n', "`n == 33` compares n with 33"),
    ('  - expr: "per >= 32"', '  - expr: "per >= 32 or n in (32, 31)"', "constraints[0].expr", "  - expr: ",
     "compares n with 31"),
    ('  per: "n // t"', '  per: "n // t if n != 31 else 1"', "derived.per", "  per: ", "compares n with 31"),
    ('grid: "B"', 'grid: "B if not flag == \'no\' else 1"', "launch.grid", "launch: ", "compares flag with 'no'"),
])
def test_other_expressions_comparing_with_a_value_never_taken(tmp_path, old, new, key, needle, reason):
    text = toy_with(old, new, TOY_RETILE)
    e = spec_error(tmp_path, text, key, line_of(text, needle))
    assert reason in e.reason, e.reason


def _first_valid_rule(spec, params, facts):
    ctx = {**params, **facts}
    for rule in spec.rules:
        if rule.when is not None and not gexpr.evaluate(rule.when, ctx):
            continue
        if not spec.violations(params, dict(rule.use)):
            return rule
    raise AssertionError("no rule")


def test_select_gdn_rules():
    spec = get_spec("gdn")
    for layout in ("klast", "kmajor"):
        for K in (64, 128, 256):
            for sd in ("fp32", "bf16"):
                for T in (1, 4):
                    for B in (1, 512):
                        p = _params(layout=layout, K=K, V=128, state_dtype=sd, T=T)
                        f = dict(FACTS, B=B)
                        tunables, rule = dispatch.select(spec, p, f)
                        assert rule is _first_valid_rule(spec, p, f)
                        assert tunables == dict(rule.use)
                        assert spec.violations(p, tunables) == []
    # K-major bf16 K=256: only the last fallback (32 lanes per row) is valid
    kb = _params(layout="kmajor", K=256, V=64, state_dtype="bf16", T=1)
    tunables, rule = dispatch.select(spec, kb, FACTS)
    assert rule.when is None and tunables["lanes_per_row"] == 32


def test_explain_lines(toy):
    lines = dispatch.explain(toy, {"n": 64, "flag": False}, {"B": 200})
    assert len(lines) == 3
    assert lines[0].startswith("rule 0: {'t': 4} violates per >= 32 (at least 32 per thread)")
    assert lines[1] == "rule 1: CHOSEN {'t': 2} (medium)"
    assert lines[2] == "rule 2: also valid {'t': 1} (fallback)"
    lines = dispatch.explain(toy, {"n": 128, "flag": False}, {"B": 5})
    assert lines[0] == "rule 0: when `B > 100` is false"
    assert lines[1] == "rule 1: when `B > 10` is false"
    assert lines[2] == "rule 2: CHOSEN {'t': 1} (fallback)"


def test_explain_agrees_with_select():
    spec = get_spec("gdn")
    for layout in ("klast", "kmajor"):
        for K in (64, 128, 256):
            for sd in ("fp32", "bf16"):
                for B in (1, 512):
                    p = _params(layout=layout, K=K, V=128, state_dtype=sd)
                    f = dict(FACTS, B=B)
                    _, rule = dispatch.select(spec, p, f)
                    lines = dispatch.explain(spec, p, f)
                    assert len(lines) == len(spec.rules) + len(spec.retile)  # a line per rule, then per retile entry
                    chosen = [i for i, line in enumerate(lines) if "CHOSEN" in line]
                    assert chosen == [spec.rules.index(rule)]
                    assert all(re.match(rf"rule {i}: ", line) for i, line in enumerate(lines[:len(spec.rules)]))
                    assert all(re.match(rf"retile {i}: .* false$", line)  # native calls: no retile applies
                               for i, line in enumerate(lines[len(spec.rules):]))

# ---- param_domains ------------------------------------------------------------------------------


def test_param_domain_accepts_values_beyond_the_list():
    spec = get_spec("nvfp4_quantize")
    assert dict(spec.domains) == {"K": "K % 16 == 0 and 16 <= K <= 1048576"}
    assert spec.accepts("K", 7680) and spec.accepts("K", 16) and 7680 not in spec.allowed("K")
    for bad in (8, 7688, 0, -16, 2**20 + 16, 7680.0, True, "7680", None):
        assert not spec.accepts("K", bad), bad
    assert not spec.accepts("in_dtype", "fp64") and spec.accepts("in_dtype", "bf16")
    base = dict(in_dtype="bf16", sf_layout="linear", hw_e2m1=False, pdl=False, recipe="fast", scale="tensor",
                four_over_six="off")
    spec.check_params(dict(base, K=7680))
    with pytest.raises(ValueError, match=r"param K must be one of \[16, .*\] or an integer with K % 16 == 0"):
        spec.check_params(dict(base, K=7688))


@pytest.mark.parametrize("domains, reason", [
    ('param_domains:\n  nope: "nope > 0"\n', "must name a param"),
    ('param_domains:\n  K: "K % 16 == 0 and M > 0"\n', "may read only K"),
    ('param_domains:\n  K: "K % 32 == 0"\n', "the listed value 16 is outside the domain"),
    ('param_domains:\n  in_dtype: "in_dtype != 1"\n', "only integer params take a domain"),
    ('param_domains:\n  K: "K %"\n', "syntax error"),
    ('param_domains: [K]\n', "expected a mapping"),
])
def test_param_domain_errors(tmp_path, domains, reason):
    text = (SPEC_DIR / "nvfp4_quantize.yaml").read_text()
    i = text.index("param_domains:")
    j = text.index("tunables:")
    path = tmp_path / "nvfp4_quantize.yaml"
    path.write_text(text[:i] + domains + "\n" + text[j:])
    with pytest.raises(SpecError) as ei:
        load_spec_file(path)
    assert "param_domains" in str(ei.value) and reason in str(ei.value)


# ---- the kernel interface's defaults (args "TYPE = DEFAULT", param_defaults) ----------------------------------


def test_arg_and_param_defaults_are_parsed(tmp_path):
    text = toy_with("args: {x: ptr, rows: i32}", 'args: {x: ptr, y: "ptr = null", rows: "i32 = -3", s: "f32 = 0.5", '
                    'w: "i64 = 7"}\nparam_defaults: {flag: false}')
    spec = load_spec_file(write(tmp_path, text, "toy.yaml"))
    assert spec.args == (("x", "ptr"), ("y", "ptr"), ("rows", "i32"), ("s", "f32"), ("w", "i64"))
    assert spec.arg_defaults == (("y", 0), ("rows", -3), ("s", 0.5), ("w", 7))
    assert spec.param_defaults == (("flag", False),)


def test_the_shipped_gdn_spec_declares_a_default_for_every_optional_name():
    spec = get_spec("gdn")
    required_args = [n for n, _ in spec.args if n not in dict(spec.arg_defaults)]
    assert required_args == ["state", "slot_stride", "pool_size", "B", "H", "HV", "scale", "s_head", "s_row"]
    required_params = [n for n in spec.param_names if n not in dict(spec.param_defaults)]
    assert required_params == ["K", "V", "T", "in_dtype", "out_dtype", "state_dtype", "dtb_dtype", "pool", "idx_dtype",
                               "update", "l2norm"]


@pytest.mark.parametrize("args, key, reason", [
    ('{x: "ptr = 5"}', "args.x", "default: expected null (or 0) for a ptr, got '5'"),
    ('{x: "i32 = 1e3"}', "args.x", "default: expected a 32-bit integer for a i32, got '1e3'"),
    ('{x: "i32 = 2147483648"}', "args.x", "default: expected a 32-bit integer for a i32, got '2147483648'"),
    ('{x: "f32 = inf"}', "args.x", "default: expected a finite number for a f32, got 'inf'"),
    ('{x: "ptr ="}', "args.x", "expected an identifier mapped to one of"),
    ('{x: "u8 = 1"}', "args.x", "expected an identifier mapped to one of"),
])
def test_a_bad_arg_default_names_the_arg(tmp_path, args, key, reason):
    with pytest.raises(SpecError) as e:
        load_spec_file(write(tmp_path, toy_with("args: {x: ptr, rows: i32}", f"args: {args}"), "toy.yaml"))
    assert f"{key}:" in str(e.value) and reason in str(e.value)


@pytest.mark.parametrize("defaults, reason", [
    ("{nope: 1}", "param_defaults.nope: expected a param of the spec (n, flag), got 'nope'"),
    ("{n: 48}", "param_defaults.n: expected one of [32, 64, 128], got 48"),
    ("{flag: 1}", "param_defaults.flag: expected one of [False, True], got 1"),
])
def test_a_bad_param_default_names_it(tmp_path, defaults, reason):
    with pytest.raises(SpecError, match=re.escape(reason)):
        load_spec_file(write(tmp_path, TOY + f"param_defaults: {defaults}\n", "toy.yaml"))


def test_a_huge_power_is_an_error_not_a_hang():
    """Jinja's optimizer folded constant powers while compiling: ``1_000 ** 10**25`` (found by test_fuzz) never
    finished. ``**`` is intercepted: never folded, and bounded when evaluated."""
    import time

    from gdnjit.expr_jinja import MAX_POWER_BITS

    t0 = time.perf_counter()
    for text in ("1_000 ** 9999999999999999999999999", "1_000 ** 9999999999999999999999999 ** -1 | abs"):
        gexpr.check_expr(text)  # loads (a spec's check), without computing the power
        with pytest.raises(gexpr.ExprError, match=rf"1000 \*\* 9999999999999999999999999: expected a power of at most "
                                                  rf"{MAX_POWER_BITS} bits"):
            gexpr.evaluate(text, {})
    assert time.perf_counter() - t0 < 5
    assert gexpr.evaluate("2 ** 10 | abs", {}) == 1024 and gexpr.evaluate("(x ** 3) | abs", {"x": -3}) == 27
