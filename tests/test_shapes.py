"""Shapes files: the shipped ones load by name, name without ``.yaml`` and path; problems of any spec
take params and facts from a model's dims (the spec's ``from_model``, a call's own bindings), heads
divided by the tensor-parallel degree; every error names file, key and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from gdnjit.errors import SpecError
from gdnjit.shapes import SHAPES_DIR, Problem, iter_facts, load_shapes, params_for, resolve_path, shipped_shapes
from gdnjit.spec import get_spec
from gdnjit.gdn import NATIVE_CONVENTIONS

SHIPPED = ["qwen35.yaml", "qwen3_next.yaml"]
QWEN35 = (SHAPES_DIR / "qwen35.yaml").read_text()


def line_of(text: str, pattern: str) -> int:
    """1-based number of the first line matching the regex ``pattern``."""
    for i, line in enumerate(text.splitlines(), 1):
        if re.search(pattern, line):
            return i
    raise AssertionError(f"{pattern!r} not in text")


def write(tmp_path: Path, text: str, name: str = "shapes.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1000)


def shapes_error(tmp_path: Path, text: str, key: str, line: int | None) -> SpecError:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as ei:
        load_shapes(path)
    e = ei.value
    msg = str(e)
    assert e.file == str(path) and str(path) in msg
    assert e.key == key, msg
    assert f": {key}: " in msg, msg
    if line is not None:
        assert e.line == line, msg
        assert msg.startswith(f"{path}:{line}: "), msg
    return e


def small_doc() -> dict:
    """A small valid shapes document."""
    return {
        "name": "small",
        "description": "test",
        "models": {"m": {"H": 16, "HV": 32, "K": 128, "V": 128}},
        "tp": [1, 2],
        "batch_sizes": [1, 64],
        "defaults": {
            "in_dtype": "bf16", "out_dtype": "bf16", "dtb_dtype": "fp32", "idx_dtype": "int32",
            "same_pool": True, "inter_dtype": "none", "ssm_idx_dtype": "none", "update": True, "l2norm": True, "slot_strided": False, **NATIVE_CONVENTIONS,
        },
        "calls": [{"name": "decode", "spec": "gdn", "params": {"layout": "klast", "T": 1, "state_dtype": ["fp32", "bf16"], "pool": True}}],
    }


# ---- shipped files ------------------------------------------------------------------------------


def test_shipped_list():
    assert shipped_shapes() == sorted(p.name for p in SHAPES_DIR.glob("*.yaml"))
    assert set(SHIPPED) <= set(shipped_shapes())


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_load_by_name_stem_and_path(fname):
    stem = fname[: -len(".yaml")]
    by_name = load_shapes(fname)
    assert by_name
    assert load_shapes(stem) == by_name
    assert load_shapes(SHAPES_DIR / fname) == by_name
    assert load_shapes(str(SHAPES_DIR / fname)) == by_name
    assert resolve_path(stem) == resolve_path(fname) == SHAPES_DIR / fname


def test_load_by_path_copy(tmp_path):
    p = write(tmp_path, QWEN35, "copy.yaml")
    assert load_shapes(p) == load_shapes("qwen35")


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_problems(fname):
    doc = yaml.safe_load((SHAPES_DIR / fname).read_text())
    problems = load_shapes(fname)
    # one problem per model x tp x (product of each call's list-valued params and bound dims)
    n_combos = 0
    for call in doc["calls"]:
        k = 1
        for v in [*call.get("params", {}).values(), *call.get("from_model", {}).values()]:
            k *= len(v) if isinstance(v, list) else 1
        n_combos += k
    assert len(problems) == len(doc["models"]) * len(doc["tp"]) * n_combos
    for pr in problems:
        assert isinstance(pr, Problem)
        spec = get_spec(pr.spec)
        call = next(c for c in doc["calls"] if c["name"] == pr.call)
        assert pr.spec == call["spec"]
        dims = doc["models"][pr.model]
        assert pr.tp in doc["tp"]
        params, facts = dict(pr.params), dict(pr.facts)
        by_arch = dict(spec.from_arch)
        assert tuple(params) == tuple(n for n in spec.param_names if n not in by_arch)
        for arch in ("sm_90", "sm_100a"):
            full = params_for(pr, arch)
            spec.check_params(full)
            assert {n: full[n] for n in by_arch} == spec.arch_params(arch)
        assert pr.batch_fact == spec.batch_fact and pr.batch_sizes == tuple(call.get("batch_sizes", doc["batch_sizes"]))
        if pr.spec in ("gdn", "gdn_lazy"):
            assert facts == {"H": dims["H"] // pr.tp, "HV": dims["HV"] // pr.tp}
            assert facts["H"] * pr.tp == dims["H"] and facts["HV"] * pr.tp == dims["HV"]
            assert params["K"] == dims["K"] and params["V"] == dims["V"]
        elif pr.spec == "causal_conv1d_update":  # the q, k and v channels of one GPU's heads
            assert facts == {"D": (2 * dims["H"] * dims["K"] + dims["HV"] * dims["V"]) // pr.tp}
            assert params["W"] == 4 and params["idx_dtype"] == "int32"
        else:
            assert pr.spec == "nvfp4_quantize" and facts == {}
            assert params["K"] in {dims["hidden"], dims["intermediate"] // pr.tp}
    # every tp degree occurs for every model
    assert {(p.model, p.tp) for p in problems} == {(m, t) for m in doc["models"] for t in doc["tp"]}


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_files_list_the_nvfp4_shapes(fname):
    """The models' NVFP4 activation shapes: K = hidden size (attention / MoE inputs) and the per-GPU
    intermediate size (down-projection inputs), bf16 in the 128x4 layout, M over the token counts."""
    doc = yaml.safe_load((SHAPES_DIR / fname).read_text())
    nv = [p for p in load_shapes(fname) if p.spec == "nvfp4_quantize"]
    assert {(p.model, p.tp, dict(p.params)["K"]) for p in nv} == {
        (m, tp, k) for m, d in doc["models"].items() for tp in doc["tp"] for k in (d["hidden"], d["intermediate"] // tp)}
    assert all(p.batch_fact == "M" and max(p.batch_sizes) >= 4096 for p in nv)


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_files_list_the_conv_shapes(fname):
    """The conv before each GDN layer: decode (T = 1) and the speculative verify of every T the GDN verify
    calls list, over the same models and degrees."""
    probs = load_shapes(fname)
    conv = [p for p in probs if p.spec == "causal_conv1d_update"]
    verify_T = {dict(p.params)["T"] for p in probs if p.spec == "gdn" and dict(p.params)["T"] > 1}
    assert {dict(p.params)["T"] for p in conv if dict(p.params)["acc_dtype"] == "int32"} == verify_T
    assert any(dict(p.params)["T"] == 1 and dict(p.params)["acc_dtype"] == "none" for p in conv)
    assert all(p.batch_fact == "B" for p in conv)


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_files_warm_the_speculative_steps_the_ops_launch(fname):
    """The fused step, its flush and FlashInfer's ReplaySSM verify and commit, as the op modules build them (their
    KernelCall params), are among the shipped file's problems, so `gdnjit warm` compiles what they launch."""
    from gdnjit.gdn_engine import prepare as engine_prepare
    from gdnjit.replay import prepare as replay_prepare
    from gdnjit.spec_step import prepare as step_prepare, spec_cache

    probs = {(p.spec, tuple(sorted(dict(p.params).items()))) for p in load_shapes(fname)}
    bf = torch.bfloat16
    H, HV, K, V, B, S, T = 16, 32, 128, 128, 4, 9, 3
    for sdt in (torch.float32, torch.bfloat16):
        z = lambda *s: torch.zeros(*s, dtype=bf)  # noqa: E731
        idx = torch.zeros(B, dtype=torch.int32)
        state = torch.zeros(S, HV, V, K, dtype=sdt)
        cache = spec_cache(S, H, HV, T, K, V)
        step = step_prepare(z(B, T, H, K), z(B, T, H, K), z(B, T, HV, V), torch.zeros(HV), z(B, T, HV), torch.zeros(HV),
                            z(B, T, HV), state, idx, idx, cache, None, True, 1.0, 20.0, -1, None, require_cuda=False)[1]
        flush = step_prepare(None, None, None, None, None, None, None, state, idx, idx, cache, None, True, 1.0, 20.0, -1,
                             None, flush=True, require_cuda=False)[1]
        caches = (z(S, HV, T, V), z(S, H, T, K), torch.zeros(S, HV, T), torch.zeros(S, HV, T))
        verify = engine_prepare(z(B, T, H, K), z(B, T, H, K), z(B, T, HV, V), torch.zeros(HV), z(B, T, HV),
                                torch.zeros(HV), z(B, T, HV), state, T, idx, None, None, None, None, None, None, False,
                                False, "negative", "skip", "raw", None, True, 1.0, 20.0, None, require_cuda=False,
                                replay_cache=caches, zero_padding=True)[1]
        commit = replay_prepare(state[None], z(1, S, HV, T, V), z(1, S, H, T, K), torch.zeros(1, S, HV, T),
                                torch.zeros(1, S, HV, T), idx, idx, None, None, True, -1, require_cuda=False)
        for name, call in (("spec_step", step), ("spec_flush", flush), ("replayssm_verify", verify),
                           ("replayssm_commit", commit)):
            assert ("gdn", tuple(sorted(call.params.items()))) in probs, (fname, name, sdt)


def heads(p: Problem) -> tuple[int, int]:
    f = dict(p.facts)
    return f["H"], f["HV"]


def test_qwen35_heads_divided_by_tp():
    problems = [p for p in load_shapes("qwen35") if p.spec == "gdn"]
    big = {(p.tp, *heads(p)) for p in problems if p.model == "qwen3.5-397b-a17b"}
    assert big == {(1, 16, 64), (2, 8, 32), (4, 4, 16), (8, 2, 8)}
    small = {(p.tp, heads(p)[1]) for p in problems if p.model == "qwen3.5-35b-a3b"}
    assert small == {(1, 32), (2, 16), (4, 8), (8, 4)}


def test_iter_facts():
    pr = load_shapes("qwen3_next")[0]
    H, HV = heads(pr)
    facts = list(iter_facts(pr, 132))
    assert [f["B"] for f in facts] == list(pr.batch_sizes)
    assert all(f == {"B": f["B"], "H": H, "HV": HV, "num_sms": 132} for f in facts)
    nv = next(p for p in load_shapes("qwen3_next") if p.spec == "nvfp4_quantize")
    assert [f for f in iter_facts(nv, 78)] == [{"M": m, "num_sms": 78} for m in nv.batch_sizes]


def test_small_doc_valid(tmp_path):
    problems = load_shapes(write(tmp_path, dump(small_doc())))
    assert len(problems) == 1 * 2 * 2
    assert {dict(p.params)["state_dtype"] for p in problems} == {"fp32", "bf16"}
    assert {(p.tp, *heads(p)) for p in problems} == {(1, 16, 32), (2, 8, 16)}


def test_nvfp4_call_binds_k_from_model_dims(tmp_path):
    doc = small_doc()
    doc["models"]["m"].update(hidden=2048, intermediate=768)
    doc["calls"].append({"name": "quant", "spec": "nvfp4_quantize",
                         "params": {"in_dtype": "bf16", "sf_layout": "128x4", "pdl": True, "recipe": "fast",
                                    "scale": "tensor", "four_over_six": "off"},
                         "from_model": {"K": ["hidden", "intermediate / tp"]}, "batch_sizes": [16, 8192]})
    nv = [p for p in load_shapes(write(tmp_path, dump(doc))) if p.spec == "nvfp4_quantize"]
    assert {(p.tp, dict(p.params)["K"]) for p in nv} == {(1, 2048), (1, 768), (2, 2048), (2, 384)}
    assert all(p.batch_sizes == (16, 8192) and p.batch_fact == "M" and p.facts == () for p in nv)


def test_k_outside_the_list_but_in_the_domain(tmp_path):
    doc = small_doc()
    doc["models"]["m"].update(hidden=7680)
    doc["calls"] = [{"name": "q", "spec": "nvfp4_quantize", "from_model": {"K": "hidden"},
                     "params": {"in_dtype": "bf16", "sf_layout": "linear", "pdl": False, "recipe": "exact", "scale": "token",
                                "four_over_six": "mae"}}]
    doc["defaults"] = {}
    assert {dict(p.params)["K"] for p in load_shapes(write(tmp_path, dump(doc)))} == {7680}
    doc["models"]["m"]["hidden"] = 7688
    text = dump(doc)
    e = shapes_error(tmp_path, text, "models.m", line_of(text, r"^\s+m:"))
    assert "K=7688 not supported" in e.reason and "K % 16 == 0" in e.reason


def test_tp_not_dividing_a_bound_dim(tmp_path):
    doc = small_doc()
    doc["models"]["m"].update(H=32, HV=32, hidden=2048, intermediate=1008)
    doc["tp"] = [1, 32]
    doc["calls"] = [{"name": "q", "spec": "nvfp4_quantize", "from_model": {"K": "intermediate / tp"},
                     "params": {"in_dtype": "bf16", "sf_layout": "linear", "pdl": False, "recipe": "exact", "scale": "token",
                                "four_over_six": "mae"}}]
    doc["defaults"] = {}
    text = dump(doc)
    e = shapes_error(tmp_path, text, "tp", line_of(text, r"^tp:"))
    assert "degree 32 does not divide K of m: intermediate / tp = 31.5" in e.reason


@pytest.mark.parametrize("bind, key, reason", [
    ({"X": "hidden"}, "calls[1].from_model.X", "expected a param or fact of spec nvfp4_quantize"),
    ({"M": "hidden"}, "calls[1].from_model.M", "expected a param or fact"),  # the batch fact is listed, not bound
    ({"K": "hidden +"}, "calls[1].from_model.K", "syntax error"),
    ({"K": "nope"}, "models.m", "K = nope"),
])
def test_bad_from_model(tmp_path, bind, key, reason):
    doc = small_doc()
    doc["models"]["m"]["hidden"] = 2048
    doc["calls"].append({"name": "q", "spec": "nvfp4_quantize", "from_model": bind,
                         "params": {"in_dtype": "bf16", "sf_layout": "linear", "pdl": False, "recipe": "exact", "scale": "token",
                                "four_over_six": "mae"}})
    text = dump(doc)
    e = shapes_error(tmp_path, text, key, None)
    assert reason in e.reason


def test_call_params_override_defaults(tmp_path):
    doc = small_doc()
    doc["calls"][0]["params"]["out_dtype"] = "fp32"
    problems = load_shapes(write(tmp_path, dump(doc)))
    assert {dict(p.params)["out_dtype"] for p in problems} == {"fp32"}


# ---- errors ------------------------------------------------------------------------------------


def test_unknown_file():
    with pytest.raises(ValueError, match="no file 'nope.yaml'") as ei:
        resolve_path("nope.yaml")
    assert "qwen35.yaml" in str(ei.value)
    with pytest.raises(ValueError):
        load_shapes("nope")


def test_bad_yaml(tmp_path):
    text = QWEN35.replace("tp: [1, 2, 4, 8]", "tp: [1, 2, 4, 8")
    e = shapes_error(tmp_path, text, "<yaml>", None)
    assert e.line is not None


def test_not_a_mapping(tmp_path):
    shapes_error(tmp_path, "- a\n", "<top>", 1)


def test_unknown_top_key(tmp_path):
    text = QWEN35 + "bogus: 1\n"
    e = shapes_error(tmp_path, text, "bogus", len(QWEN35.splitlines()) + 1)
    assert "unknown key" in e.reason


@pytest.mark.parametrize("key", ["models", "tp", "batch_sizes", "calls"])
def test_missing_key(tmp_path, key):
    doc = small_doc()
    del doc[key]
    e = shapes_error(tmp_path, dump(doc), key, 1)
    assert "required key is missing" in e.reason


def test_optional_keys(tmp_path):
    doc = small_doc()
    for k in ("name", "description"):
        del doc[k]
    assert load_shapes(write(tmp_path, dump(doc)))


@pytest.mark.parametrize(
    "dims",
    [
        "{H: 0, HV: 64, K: 128, V: 128}",
        "{H: -16, HV: 64, K: 128, V: 128}",
        "{H: 16, HV: 64.0, K: 128, V: 128}",
        "{H: 16, HV: '64', K: 128, V: 128}",
        "{H: true, HV: 64, K: 128, V: 128}",
        "[16, 64, 128, 128]",
        "64",
    ],
)
def test_bad_model_dims(tmp_path, dims):
    pat = r"^\s+qwen3\.5-122b-a10b:"
    text = re.sub(r"(?m)^(\s+qwen3\.5-122b-a10b:).*$", r"\1 " + dims, QWEN35)
    e = shapes_error(tmp_path, text, "models.qwen3.5-122b-a10b", line_of(QWEN35, pat))
    assert "positive integers" in e.reason


def test_model_missing_a_dim_the_spec_takes(tmp_path):
    pat = r"^\s+qwen3\.5-122b-a10b:"
    text = re.sub(r"(?m)^(\s+qwen3\.5-122b-a10b:).*$", r"\1 {H: 16, HV: 64, K: 128, hidden: 3072, intermediate: 1024}",
                  QWEN35)
    e = shapes_error(tmp_path, text, "models.qwen3.5-122b-a10b", line_of(QWEN35, pat))
    assert "V = V:" in e.reason and "undefined" in e.reason


def test_model_dims_other_specs_use_are_allowed(tmp_path):
    doc = small_doc()
    doc["models"]["m"]["conv_dim"] = 8192  # read by no call here: harmless
    assert load_shapes(write(tmp_path, dump(doc)))


def test_model_dim_not_supported_by_spec(tmp_path):
    pat = r"^\s+qwen3\.5-27b:"
    text = re.sub(r"(?m)^(\s+qwen3\.5-27b:).*$", r"\1 {H: 16, HV: 48, K: 96, V: 128}", QWEN35)
    e = shapes_error(tmp_path, text, "models.qwen3.5-27b", line_of(QWEN35, pat))
    assert "K=96 not supported" in e.reason


def test_hv_not_multiple_of_h(tmp_path):
    pat = r"^\s+qwen3\.5-27b:"
    text = re.sub(r"(?m)^(\s+qwen3\.5-27b:).*$", r"\1 {H: 16, HV: 40, K: 128, V: 128}", QWEN35)
    e = shapes_error(tmp_path, text, "models.qwen3.5-27b", line_of(QWEN35, pat))
    assert "HV % H == 0 does not hold for H=16, HV=40, K=128, V=128" in e.reason


@pytest.mark.parametrize("value", ["[]", "3", "[1, 0]", "[1, -2]", "[1, 2.0]", "[true]", "[1, '2']"])
@pytest.mark.parametrize("key", ["tp", "batch_sizes"])
def test_bad_int_lists(tmp_path, key, value):
    text = re.sub(rf"(?m)^{key}:.*$", f"{key}: {value}", QWEN35)
    e = shapes_error(tmp_path, text, key, line_of(QWEN35, rf"^{key}:"))
    assert "positive integers" in e.reason


def test_tp_not_dividing_heads(tmp_path):
    # 3 divides HV=48 of qwen3.5-27b but no H=16
    text = re.sub(r"(?m)^tp:.*$", "tp: [1, 3]", QWEN35)
    e = shapes_error(tmp_path, text, "tp", line_of(QWEN35, r"^tp:"))
    assert "degree 3 does not divide" in e.reason


def test_tp_divides_hv_but_not_h(tmp_path):
    doc = small_doc()
    doc["models"] = {"odd": {"H": 2, "HV": 8, "K": 128, "V": 128}}
    doc["tp"] = [1, 4]
    text = dump(doc)
    e = shapes_error(tmp_path, text, "tp", line_of(text, r"^tp:"))
    assert "degree 4" in e.reason and "odd" in e.reason and "H=2" in e.reason


def test_defaults_not_a_mapping(tmp_path):
    doc = small_doc()
    doc["defaults"] = ["bf16"]
    text = dump(doc)
    shapes_error(tmp_path, text, "defaults", line_of(text, r"^defaults:"))


@pytest.mark.parametrize("value", [[], {}, "x"])
def test_calls_not_a_list(tmp_path, value):
    doc = small_doc()
    doc["calls"] = value
    text = dump(doc)
    shapes_error(tmp_path, text, "calls", line_of(text, r"^calls:"))


@pytest.mark.parametrize(
    "call",
    [{"spec": "gdn", "params": {}}, {"name": "x", "params": {}}, {"name": "x", "spec": "gdn", "bogus": 1}, "decode"],
)
def test_bad_call_shape(tmp_path, call):
    doc = small_doc()
    doc["calls"].append(call)
    text = dump(doc)
    last_item = max(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("- "))
    shapes_error(tmp_path, text, "calls[1]", last_item)


def test_unknown_spec(tmp_path):
    text = QWEN35.replace("    spec: gdn\n", "    spec: nope\n", 1)
    e = shapes_error(tmp_path, text, "calls[0].spec", line_of(QWEN35, r"^\s+spec: gdn"))
    assert "no shipped spec 'nope'" in e.reason


def _verify_params_line(text: str) -> int:
    return line_of(text, r"^\s+params: \{layout: klast, T: \[2, 3")


def test_unknown_params(tmp_path):
    text = QWEN35.replace("update: false}", "update: false, warp_size: 32}", 1)
    e = shapes_error(tmp_path, text, "calls[1].params", _verify_params_line(QWEN35))
    assert "unknown params ['warp_size']" in e.reason


def test_unknown_default_param(tmp_path):
    doc = small_doc()
    doc["defaults"]["bogus"] = 1
    text = dump(doc)
    e = shapes_error(tmp_path, text, "defaults", line_of(text, r"^defaults:"))
    assert "['bogus']" in e.reason and "no call's spec has them" in e.reason


def test_missing_params(tmp_path):
    text = re.sub(r"(?m)^  l2norm: true\n", "", QWEN35)
    e = shapes_error(tmp_path, text, "calls[0].params", line_of(text, r"^\s+params: \{layout: klast, T: 1"))
    assert "missing params ['l2norm']" in e.reason


VERIFY = "layout: klast, T: [2, 3, 4, 5, 6, 7, 8], state_dtype: fp32"


@pytest.mark.parametrize(
    "new,name,shown",
    [
        ("layout: klast, T: [2, 3, 4, 5, 6, 7, 8, 17], state_dtype: fp32", "T", "17"),
        ("layout: klast, T: [2, 3, 4, 5, 6, 7, 8], state_dtype: fp64", "state_dtype", "'fp64'"),
        ("layout: rowmajor, T: [2, 3, 4, 5, 6, 7, 8], state_dtype: fp32", "layout", "'rowmajor'"),
        ("layout: klast, T: ['2'], state_dtype: fp32", "T", "'2'"),
    ],
)
def test_disallowed_param(tmp_path, new, name, shown):
    assert QWEN35.count(VERIFY) == 1
    text = QWEN35.replace(VERIFY, new)
    e = shapes_error(tmp_path, text, f"calls[1].params.{name}", _verify_params_line(QWEN35))
    assert f"{shown} is not allowed by spec gdn" in e.reason


def test_disallowed_default(tmp_path):
    text = QWEN35.replace("  in_dtype: bf16\n", "  in_dtype: fp8\n", 1)
    e = shapes_error(tmp_path, text, "calls[0].params.in_dtype", None)
    assert "'fp8'" in e.reason


def test_arch_params_are_not_set_by_shapes_files(tmp_path):
    """hw_e2m1 follows the target arch (the op sets it from the device): warm sets it per --arch."""
    doc = small_doc()
    doc["models"]["m"]["hidden"] = 2048
    doc["calls"].append({"name": "q", "spec": "nvfp4_quantize", "from_model": {"K": "hidden"},
                         "params": {"in_dtype": "bf16", "sf_layout": "linear", "pdl": False, "recipe": "fast", "hw_e2m1": True,
                                    "scale": "tensor", "four_over_six": "off"}})
    text = dump(doc)
    e = shapes_error(tmp_path, text, "calls[1].params", None)
    assert "['hw_e2m1']: set from the target arch" in e.reason
    assert get_spec("nvfp4_quantize").arch_params("sm_90") == {"hw_e2m1": False}
    assert get_spec("nvfp4_quantize").arch_params("sm_100a") == {"hw_e2m1": True}
    from gdnjit import nvfp4

    for arch, n in (("sm_89", 89), ("sm_90", 90), ("sm_100a", 100), ("sm_120a", 120)):  # the op agrees
        assert get_spec("nvfp4_quantize").arch_params(arch)["hw_e2m1"] is (n >= nvfp4._HW_E2M1_ARCH)
