"""The torch custom ops (gdnjit.torch_ops) on the CPU: schemas, fake implementations, opcheck, and
torch.compile(fullgraph=True) through the CPU (torch reference) implementations.

The CUDA kernels behind the same ops are checked by tests/ops/test_torch_ops_gpu.py (pytest -m gpu).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gdnjit
import gdnjit.torch_ops as ops
from gdnjit.reference.nvfp4 import quantize_reference
from gdnjit.reference.gdn import gdn_reference

ROOT = Path(__file__).resolve().parents[1]

MUTATED = {
    "gated_delta_rule_decode_pretranspose": {"state", "output", "initial_state", "intermediate_states_buffer"},
    "gated_delta_rule_decode": {"state", "output"},
    "gated_delta_rule_mtp": {"initial_state", "output", "intermediate_states_buffer"},
    "nvfp4_quantize": set(),
    "dequantize_nvfp4": set(),
    "causal_conv1d_update": {"conv_state", "out"},
    "engine_step": {"state", "inter", "output", "rawv", "rawk", "g_cache", "beta_cache"},
    "spec_step": {"state", "cache_k", "cache_v", "cache_g", "cache_beta", "cache_ctl", "output"},
    "gated_delta_rule_replayssm_commit": {"checkpoint_state"},
    "lazy_step": {"state", "cache_k", "cache_u", "cache_g", "cache_cursor", "output"},
    "lazy_fold": {"state", "cache_cursor"},
    "lazy_reset": {"cache_cursor"},
}


def raw(name):
    return getattr(torch.ops.gdnjit, name).default


# ---- schemas and registration ------------------------------------------------------------------

def test_every_public_op_is_registered():
    import gdnjit

    expected = ["gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode", "gated_delta_rule_mtp",
                "nvfp4_quantize", "dequantize_nvfp4", "causal_conv1d_update", "engine_step", "spec_step",
                "gated_delta_rule_replayssm_commit", "lazy_step", "lazy_fold", "lazy_reset"]
    assert list(ops.OP_NAMES) == expected
    # engine_step is gdnjit.gdn_engine's (the call behind gdnjit.compat), spec_step gdnjit.gated_delta_rule_spec_step,
    # the others gdnjit's public functions of the same name
    # lazy_step / lazy_fold / lazy_reset are gdnjit.gated_delta_rule_lazy_step / _fold / _reset
    lazy = {"lazy_step", "lazy_fold", "lazy_reset"}
    assert set(expected) - {"engine_step", "spec_step"} - lazy <= set(gdnjit.__all__) | set(dir(gdnjit))
    assert {f"gated_delta_rule_{n}" for n in lazy} <= set(gdnjit.__all__)
    assert "gated_delta_rule_spec_step" in gdnjit.__all__
    for name in expected:
        assert callable(getattr(ops, name))
        assert torch._C._jit_get_schemas_for_operator(f"gdnjit::{name}"), name


def test_every_public_name_resolves():
    """Each name of ``gdnjit.__all__`` is an attribute of the package (a lazy one loads its module), every lazy name
    is public, and FlashInfer's top-level ``fp4_quantize`` is ``gdnjit.fp4_quantize`` (gdnjit.nvfp4's)."""
    import gdnjit
    import gdnjit.nvfp4

    for name in gdnjit.__all__:
        assert getattr(gdnjit, name) is not None, name
    assert set(gdnjit._LAZY) <= set(gdnjit.__all__)
    assert gdnjit.fp4_quantize is gdnjit.nvfp4.fp4_quantize


@pytest.mark.parametrize("name", ops.OP_NAMES)
def test_schema_text_and_mutated_args(name):
    schema = raw(name)._schema
    assert str(schema) == f"gdnjit::{name}" + ops.SCHEMAS[name]
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATED[name]
    if name.startswith("gated_delta_rule"):
        assert len(schema.returns) == 0  # custom ops may not return an input alias
    if name.startswith("gated_delta_rule") and name != "gated_delta_rule_replayssm_commit":  # (the commit: no output)
        out = next(a for a in schema.arguments if a.name == "output")
        assert str(out.type) == "Tensor"  # required: the wrapper allocates it
    # the wrapper's parameters are the eager function's, in order
    import inspect

    import gdnjit

    import gdnjit.gdn_engine

    eager = (gdnjit.gdn_engine.engine_step if name == "engine_step" else gdnjit.gated_delta_rule_spec_step
             if name == "spec_step" else getattr(gdnjit, "gated_delta_rule_" + name) if name.startswith("lazy_")
             else getattr(gdnjit, name))
    assert list(inspect.signature(getattr(ops, name)).parameters) == list(inspect.signature(eager).parameters)


def test_import_gdnjit_does_not_register_the_ops():
    code = ("import sys, torch, gdnjit\n"
            "gdnjit.gated_delta_rule_mtp\n"
            "assert 'gdnjit.torch_ops' not in sys.modules\n"
            "assert not torch._C._jit_get_schemas_for_operator('gdnjit::gated_delta_rule_mtp')\n"
            "import gdnjit.torch_ops\n"
            "assert torch._C._jit_get_schemas_for_operator('gdnjit::gated_delta_rule_mtp')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr


# ---- inputs --------------------------------------------------------------------------------------

def gdn_inputs(B=3, T=1, H=2, HV=4, K=64, V=64, layout="klast", pool_slots=None, device="cpu", seed=0,
               dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, dt=dtype, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dt).to(device)

    t = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V), a=rnd(B, T, HV), b=rnd(B, T, HV),
             A_log=torch.log(torch.rand(HV, generator=g) * 15 + 1).to(device), dt_bias=rnd(HV, dt=torch.float32))
    trailing = (HV, V, K) if layout == "klast" else (HV, K, V)
    t["state"] = rnd(pool_slots or B, *trailing, dt=torch.float32, scale=0.5)
    return t


def _close(x, ref, tol):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item() < tol


# ---- fake implementations --------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fake_gdn_shapes_and_dtypes(device):
    with FakeTensorMode():
        t = {n: torch.empty(x.shape, dtype=x.dtype, device=device) for n, x in gdn_inputs(B=5, T=3).items()}
        pool = torch.empty(11, 4, 64, 64, device=device)
        idx = torch.empty(5, dtype=torch.int64, device=device)
        args = (t["q"], t["k"], t["v"])
        gates = dict(A_log=t["A_log"], a=t["a"], dt_bias=t["dt_bias"], b=t["b"])

        out, ret = ops.gated_delta_rule_decode_pretranspose(*args, None, **gates, initial_state=pool,
                                                            initial_state_indices=idx)
        assert out.shape == (5, 3, 4, 64) and out.dtype == torch.bfloat16 and out.device.type == device
        assert ret is pool
        out, ret = ops.gated_delta_rule_decode_pretranspose(*args, t["state"], **gates)
        assert out.shape == (5, 3, 4, 64) and ret is t["state"]

        given = torch.empty(5, 3, 4, 64, dtype=torch.float32, device=device)
        buf = torch.empty(5, 4, 4, 64, 64, dtype=torch.bfloat16, device=device)
        out, ret = ops.gated_delta_rule_mtp(*args, pool, idx, **gates, output=given, intermediate_states_buffer=buf,
                                            disable_state_update=True)
        assert out is given and ret is pool

        kmaj = torch.empty(5, 4, 64, 64, dtype=torch.bfloat16, device=device)
        out, ret = ops.gated_delta_rule_decode(*args, kmaj, **gates)
        assert out.shape == (5, 3, 4, 64) and out.dtype == torch.bfloat16 and ret is kmaj


@pytest.mark.parametrize("layout,rows,cols", [("128x4", 256, 20), ("8x4", 136, 20), ("linear", 130, 18)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_fake_nvfp4_shapes(layout, rows, cols, dtype):
    with FakeTensorMode():
        a = torch.empty(2, 65, 288, dtype=dtype, device="cuda")  # M = 130 rows of K = 288 (18 blocks)
        fp4, sf = ops.nvfp4_quantize(a, torch.empty(1, device="cuda"), layout)
        assert fp4.shape == (130, 144) and fp4.dtype == torch.uint8 and fp4.device.type == "cuda"
        assert sf.shape == (rows, cols) and sf.dtype == torch.uint8
        x = ops.dequantize_nvfp4(fp4, sf, 3.0, layout)
        assert x.shape == (130, 288) and x.dtype == torch.float32
        x = ops.dequantize_nvfp4(fp4, sf, torch.empty(1, device="cuda"), layout, m=100, k=288)
        assert x.shape == (100, 288)


# ---- opcheck (schema, fake tensor, AOT dispatch) with the CPU implementations ----------------------

def _gdn_opcheck_cases():
    t = gdn_inputs(B=3, T=1)
    g = (t["A_log"], t["a"], t["dt_bias"], t["b"])
    out1 = torch.empty(3, 1, 4, 64, dtype=torch.bfloat16)
    pool = torch.randn(7, 4, 64, 64)
    idx = torch.tensor([4, -1, 2], dtype=torch.int32)
    yield "pretranspose-pool", "gated_delta_rule_decode_pretranspose", (
        t["q"], t["k"], t["v"], None, *g, None, out1, True, pool, idx, None, None, False, True)
    yield "pretranspose-direct", "gated_delta_rule_decode_pretranspose", (
        t["q"], t["k"], t["v"], t["state"].clone(), *g, 0.3, out1.float(), False, None, None, None, None, False, True)
    yield "pretranspose-split", "gated_delta_rule_decode_pretranspose", (
        t["q"], t["k"], t["v"], None, *g, None, out1.clone(), True, pool.clone(), idx,
        torch.tensor([5, 0, -1], dtype=torch.int32), None, False, True)
    t4 = gdn_inputs(B=3, T=4, seed=1)
    g4 = (t4["A_log"], t4["a"], t4["dt_bias"], t4["b"])
    out4 = torch.empty(3, 4, 4, 64, dtype=torch.bfloat16)
    buf = torch.full((4, 5, 4, 64, 64), float("nan"))
    yield "mtp-verify", "gated_delta_rule_mtp", (
        t4["q"], t4["k"], t4["v"], pool.clone(), idx, *g4, None, out4, buf, None, True, True, None, True)
    yield "mtp-keep-padding", "gated_delta_rule_mtp", (
        t4["q"], t4["k"], t4["v"], pool.clone(), idx, *g4, None, torch.full_like(out4, 7.0), None, None, False, True,
        None, False)
    yield "pretranspose-verify", "gated_delta_rule_decode_pretranspose", (
        t4["q"], t4["k"], t4["v"], None, *g4, None, torch.full_like(out4, 7.0), True, pool.clone(), idx, None,
        buf.clone(), True, False)
    ssm = torch.tensor([[0, 1, -1, 3], [6, 6, 6, 6], [5, -1, -1, 6]], dtype=torch.int64)
    yield "mtp-ssm", "gated_delta_rule_mtp", (
        t4["q"], t4["k"], t4["v"], pool.clone(), idx.long(), *g4, None, out4.clone(), None, ssm, False, True, None,
        True)
    tk = gdn_inputs(B=2, T=2, layout="kmajor", seed=2)
    yield "kmajor", "gated_delta_rule_decode", (
        tk["q"], tk["k"], tk["v"], tk["state"], tk["A_log"], tk["a"], tk["dt_bias"], tk["b"], None,
        torch.empty(2, 2, 4, 64, dtype=torch.bfloat16), True)


GDN_OPCHECK = list(_gdn_opcheck_cases())


@pytest.mark.parametrize("case", GDN_OPCHECK, ids=[c[0] for c in GDN_OPCHECK])
def test_opcheck_gdn(case):
    _, name, args = case
    torch.library.opcheck(raw(name), args)


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_opcheck_nvfp4(layout):
    g = torch.Generator().manual_seed(layout)
    a = (torch.randn(37, 64, generator=g) * 3).to(torch.bfloat16)
    gs = torch.tensor([448.0 * 6 / 12.0])
    plain = (False, "off", 448, None, None, 1.0)
    torch.library.opcheck(raw("nvfp4_quantize"), (a, gs, 1.0, layout, False, 16, None, "gdnjit", True, *plain))
    torch.library.opcheck(raw("nvfp4_quantize"), (a, None, 7.5, layout, False, 16, None, "reference", False, *plain))
    # per-token scales (a row map, an out_scale) and the 4over6 search
    row_map = torch.randint(-1, 37, (40,), generator=g, dtype=torch.int32)
    torch.library.opcheck(raw("nvfp4_quantize"), (a, torch.tensor([1 / 1536]), 1.0, layout, False, 16, None, "gdnjit",
                                                  False, True, "mse_fp16", 256, row_map, torch.tensor([2.0]), 1.0))
    torch.library.opcheck(raw("nvfp4_quantize"), (a, gs, 1.0, layout, False, 16, None, "gdnjit", True, False, "mae",
                                                  448, None, None, 1.0))
    torch.library.opcheck(raw("nvfp4_quantize"), (a, None, 1 / 2688, layout, False, 16, None, "gdnjit", True, True,
                                                  "off", 448, None, None, 0.25))
    fp4, sf, pts = ops.nvfp4_quantize(a, 1 / 2688, layout, per_token_activation=True, out_scale=0.5)
    ref = quantize_reference(a, 1 / 2688, layout, "fast", per_token=True, out_scale=0.5)
    assert torch.equal(fp4, ref[0]) and torch.equal(sf, ref[1]) and torch.equal(pts, ref[2])
    fp4, sf = ops.nvfp4_quantize(a, gs, layout)
    torch.library.opcheck(raw("dequantize_nvfp4"), (fp4, sf, gs, 1.0, layout, 37, 64))


# ---- CPU implementations against the float64 reference ------------------------------------------------

def test_cpu_pool_decode_matches_reference_and_state_passed_twice():
    t = gdn_inputs(B=4)
    pool = torch.randn(9, 4, 64, 64)
    idx = torch.tensor([7, -1, 0, 3], dtype=torch.int32)
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], pool.double(),
                        read_indices=idx)
    p = pool.clone()
    out, ret = ops.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], p, t["A_log"], t["a"],
                                                        t["dt_bias"], t["b"], initial_state=p,
                                                        initial_state_indices=idx)  # FlashInfer style: pool twice
    assert ret is p and out.dtype == torch.bfloat16
    assert _close(out, ref.output, 1e-2) and _close(p, ref.state, 1e-5)
    assert (out[1] == 0).all()


def test_cpu_mtp_verify_leaves_pool_and_fills_buffer():
    t = gdn_inputs(B=3, T=3)
    pool = torch.randn(6, 4, 64, 64)
    idx = torch.tensor([5, 1, -1], dtype=torch.int64)
    buf = torch.full((3, 4, 4, 64, 64), float("nan"))
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], pool.double(),
                        read_indices=idx, intermediate=buf.double(), disable_state_update=True)
    p = pool.clone()
    out, _ = ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p, idx, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                      intermediate_states_buffer=buf, disable_state_update=True)
    assert torch.equal(p, pool)
    assert _close(out, ref.output, 1e-2)
    assert _close(buf[:2, :3], ref.intermediate[:2, :3], 1e-5)
    assert torch.isnan(buf[2]).all() and torch.isnan(buf[:, 3]).all()


def test_cpu_mtp_replayssm_verify_caches_through_the_op():
    """FlashInfer's caching verify through torch.ops.gdnjit (it runs as the engine_step op): raw k / v cached in bf16
    (fp16 inputs rounded), log decay and beta in fp32, at each live row's read slot; the pool frozen, a padding row's
    cache slot and output rows left; the eager contract's refusals raised before the op."""
    t = gdn_inputs(B=3, T=3, dtype=torch.float16)
    pool = torch.randn(6, 4, 64, 64)
    idx = torch.tensor([5, 1, -1], dtype=torch.int32)
    nan = float("nan")
    rawv, rawk = torch.full((6, 4, 3, 64), nan, dtype=torch.bfloat16), torch.full((6, 2, 3, 64), nan, dtype=torch.bfloat16)
    gc, bc = torch.full((6, 4, 3), nan), torch.full((6, 4, 3), nan)
    out = torch.full((3, 3, 4, 64), 7.0, dtype=torch.float16)
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], pool.double(),
                        read_indices=idx, disable_state_update=True)
    p = pool.clone()
    got, ret = ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p, idx, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                        output=out, disable_state_update=True, cache_replayssm=True, replayssm_rawv=rawv,
                                        replayssm_rawk=rawk, replayssm_g=gc, replayssm_beta=bc)
    assert got is out and ret is p and torch.equal(p, pool)
    assert _close(out[:2], ref.output[:2], 1e-2) and (out[2] == 7.0).all()
    for n, slot in ((0, 5), (1, 1)):
        assert torch.equal(rawk[slot], t["k"][n].transpose(0, 1).to(torch.bfloat16))
        assert torch.equal(rawv[slot], t["v"][n].transpose(0, 1).to(torch.bfloat16))
        assert not torch.isnan(gc[slot]).any() and not torch.isnan(bc[slot]).any()
    untouched = [0, 2, 3, 4]
    assert torch.isnan(rawv[untouched].float()).all() and torch.isnan(gc[untouched]).all()
    with pytest.raises(ValueError, match="disable_state_update: must be true with cache_replayssm"):
        ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p, idx, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                 disable_state_update=False, cache_replayssm=True, replayssm_rawv=rawv,
                                 replayssm_rawk=rawk, replayssm_g=gc, replayssm_beta=bc)
    longer = torch.zeros(6, 4, 5, 64)  # FlashInfer's caches hold exactly T tokens (SGLang's longer rings: its compat)
    with pytest.raises(ValueError, match=r"replayssm_g: expected T=3 tokens per slot and head \(dim 2, FlashInfer"):
        ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p, idx, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                 disable_state_update=True, cache_replayssm=True, replayssm_rawv=rawv,
                                 replayssm_rawk=rawk, replayssm_g=longer[..., 0], replayssm_beta=bc)


def _commit_args(seed=0, L=2, S=6, H=2, HV=4, T=3, K=64, V=64):
    g = torch.Generator().manual_seed(seed)
    ck = torch.randn(L, S, HV, V, K, generator=g) * 0.1
    rawv = torch.randn(L, S, HV, T, V, generator=g).to(torch.bfloat16)
    rawk = torch.randn(L, S, H, T, K, generator=g).to(torch.bfloat16)
    gc = -torch.rand(L, S, HV, T, generator=g)
    bc = torch.rand(L, S, HV, T, generator=g)
    return ck, rawv, rawk, gc, bc, torch.tensor([4, -1, 1], dtype=torch.int32), torch.tensor([2, 3, 3],
                                                                                                dtype=torch.int32)


def test_cpu_replayssm_commit_op_matches_the_reference():
    """The ReplaySSM commit through torch.ops.gdnjit on CPU tensors: the float32 reference, in place (a padding row and
    slots no request names keep their bits), with track; the eager function's errors."""
    from gdnjit.reference.replay import replay_commit_reference

    ck, rawv, rawk, gc, bc, idx, acc = _commit_args()
    track = dict(track_state_indices=torch.tensor([5, -1, 0], dtype=torch.int32),
                 track_steps=torch.tensor([0, 0, 1], dtype=torch.int32))
    expect = replay_commit_reference(ck, rawv, rawk, gc, bc, idx, acc, **track)
    got = ck.clone()
    assert ops.gated_delta_rule_replayssm_commit(got, rawv, rawk, gc, bc, idx, acc, **track) is None
    assert _close(got, expect, 1e-5)
    assert torch.equal(got[:, [2, 3]], ck[:, [2, 3]])
    with pytest.raises(ValueError, match="backend='tcgen05': FlashInfer's tcgen05 commit takes T 4..8"):  # T = 3
        ops.gated_delta_rule_replayssm_commit(got, rawv, rawk, gc, bc, idx, acc, backend="tcgen05")
    with pytest.raises(ValueError, match="backend: expected one of"):
        ops.gated_delta_rule_replayssm_commit(got, rawv, rawk, gc, bc, idx, acc, backend="cuda")


def test_opcheck_replayssm_commit():
    ck, rawv, rawk, gc, bc, idx, acc = _commit_args(seed=1)
    torch.library.opcheck(raw("gated_delta_rule_replayssm_commit"), (ck, rawv, rawk, gc, bc, idx, acc, None, None,
                                                                      True, -1, "auto"))


def test_cpu_kmajor_decode_matches_reference():
    t = gdn_inputs(B=2, T=2, layout="kmajor")
    s = t["state"].clone()
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], s.double(),
                        layout="kmajor", scale=0.2)
    out = torch.empty(2, 2, 4, 64, dtype=torch.float32)
    got, ret = ops.gated_delta_rule_decode(t["q"], t["k"], t["v"], s, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                           scale=0.2, output=out)
    assert got is out and ret is s
    assert _close(out, ref.output, 1e-5) and _close(s, ref.state, 1e-5)


def test_cpu_ops_raise_the_eager_validation_errors():
    t = gdn_inputs()
    pool = torch.randn(5, 4, 64, 64)
    with pytest.raises(ValueError, match="initial_state and initial_state_indices"):
        ops.gated_delta_rule_decode_pretranspose(t["q"], t["k"], t["v"], None, t["A_log"], t["a"], t["dt_bias"],
                                                 t["b"], initial_state=pool)
    with pytest.raises(TypeError, match="A_log: expected dtype float32"):
        ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, torch.zeros(3, dtype=torch.int32),
                                 t["A_log"].double(), t["a"], t["dt_bias"], t["b"])
    with pytest.raises(ValueError, match="ssm_state_indices: cannot be combined"):
        ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, torch.zeros(3, dtype=torch.int32), t["A_log"],
                                 t["a"], t["dt_bias"], t["b"], intermediate_states_buffer=torch.zeros(3, 1, 4, 64, 64),
                                 ssm_state_indices=torch.zeros(3, 1, dtype=torch.int32))


def _schema_tensors(op: str) -> dict:
    """Argument name -> whether the op's schema makes it an optional tensor, for its tensor arguments."""
    out = {}
    for arg in ops.SCHEMAS[op][1:ops.SCHEMAS[op].index(") ->")].split(", "):
        kind, name = arg.split(" ")[:2]
        if kind.startswith("Tensor"):
            out[name.split("=")[0]] = kind.endswith("?")
    return out


NUMBER_OR_TENSOR = {"nvfp4_quantize": ("a_global_sf", "out_scale"), "dequantize_nvfp4": ("a_global_sf",)}
WRAPPER_CACHES = {"spec_step": ("cache", gdnjit.SpecCache), "lazy_step": ("cache", gdnjit.LazyCache),
                  "lazy_fold": ("cache", gdnjit.LazyCache), "lazy_reset": ("cache", gdnjit.LazyCache)}


@pytest.mark.parametrize("name", [n for n in ops.__all__ if n != "OP_NAMES"])
def test_wrappers_name_a_bad_tensor_argument_first(name):
    """Each wrapper refuses an argument that should be a tensor (its schema's tensor arguments and its own
    tensor-annotated ones; a required one also as None) or a cache that is not one, with a TypeError naming it,
    before it reads a shape or a device or unpacks the cache (they raised AttributeError, or torch's schema
    RuntimeError, or a message about another argument)."""
    import inspect
    import typing

    fn = getattr(ops, name)
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    schema = _schema_tensors(name)
    tensors = {}
    for p in sig.parameters.values():
        hint = str(hints.get(p.name, ""))
        if p.name in schema or "Tensor" in hint:
            # required: the schema (or the annotation) takes no None and the wrapper does not allocate it
            tensors[p.name] = p.default is inspect.Parameter.empty and not schema.get(p.name, "Optional" in hint)
    assert tensors, name
    for n in NUMBER_OR_TENSOR.get(name, ()):  # a tensor or a number (the wrapper splits it)
        tensors.pop(n)
    cache = WRAPPER_CACHES.get(name)
    base = {n: torch.zeros(1) for n in tensors}
    if cache:
        base[cache[0]] = cache[1](*(torch.zeros(1),) * len(cache[1]._fields))
    extra = {"nvfp4_quantize": dict(a_global_sf=1.0), "dequantize_nvfp4": dict(a_global_sf=1.0),
             "engine_step": dict(T=1)}.get(name, {})
    for arg, required in tensors.items():
        for bad in ([1.0], 3) + ((None,) if required else ()):
            with pytest.raises(TypeError, match=rf"^{arg}: expected a torch.Tensor"):
                fn(**dict(base, **extra, **{arg: bad}))
    if "softplus_beta" in sig.parameters:  # a float the wrapper converts: named too
        with pytest.raises(TypeError, match=r"^softplus_beta: expected a Python float, got str"):
            fn(**dict(base, **extra, softplus_beta="x"))
    if name in ("spec_step", "lazy_step", "engine_step"):  # no output given: q and v give its shape, checked first
        with pytest.raises(ValueError, match=r"^q: expected 4 dimensions, got shape \(1,\)"):
            fn(**dict(base, **extra, output=None))
    if cache:
        n, kind = cache
        with pytest.raises(TypeError, match=rf"^{n}: expected a gdnjit.{kind.__name__}"):
            fn(**dict(base, **extra, **{n: None}))
        with pytest.raises(TypeError, match=rf"^{n}.{kind._fields[1]}: expected a torch.Tensor"):
            fn(**dict(base, **extra, **{n: tuple(torch.zeros(1) if i != 1 else "x" for i in range(len(kind._fields)))}))


def test_cpu_nvfp4_ops_match_the_reference():
    from gdnjit.reference.nvfp4 import dequantize_reference, quantize_reference

    a = (torch.randn(20, 128) * 5).to(torch.float16)
    for gs in (torch.tensor([100.0]), 100.0):
        fp4, sf = ops.nvfp4_quantize(a, gs, "linear")
        rf, rs = quantize_reference(a, gs, "linear")
        assert torch.equal(fp4, rf) and torch.equal(sf, rs)
        x = ops.dequantize_nvfp4(fp4, sf, gs, "linear")
        assert torch.equal(x, dequantize_reference(rf, rs, gs, "linear", 20, 128))
    with pytest.raises(TypeError, match="a_global_sf"):
        ops.nvfp4_quantize(a, "1.0")


# ---- torch.compile(fullgraph=True) on the CPU implementations ----------------------------------------

def _compiled_matches_eager(fn, make_args, backend, exact=True):
    """Outputs and the in-place updates (pool, buffer) of the compiled function equal eager's (inductor may
    fuse the surrounding torch ops differently, so there only to rounding)."""
    eager_args, comp_args = make_args(), make_args()
    expect = fn(*eager_args)
    torch._dynamo.reset()
    got = torch.compile(fn, backend=backend, fullgraph=True)(*comp_args)
    same = torch.equal if exact else (lambda x, y: torch.allclose(x, y, rtol=1e-4, atol=1e-3))  # sums: reordered
    assert len(expect) == len(got)
    for e, g in zip(list(expect) + list(eager_args), list(got) + list(comp_args)):
        if isinstance(e, torch.Tensor):
            assert same(e.nan_to_num(), g.nan_to_num())


def _decode_step():
    t = gdn_inputs(B=4, seed=3)
    backing = torch.randn(8 * (4 * 64 * 64 + 64))  # page-strided pool: 64 floats between slots
    pool = backing.as_strided((8, 4, 64, 64), (4 * 64 * 64 + 64, 64 * 64, 64, 1))
    idx = torch.tensor([6, -1, 0, 2], dtype=torch.int32)

    def fn(x, pool, idx):
        q, k = t["q"] * x, t["k"]
        out, pool = ops.gated_delta_rule_decode_pretranspose(q, k, t["v"], None, t["A_log"], t["a"],
                                                             t["dt_bias"], t["b"], initial_state=pool,
                                                             initial_state_indices=idx)
        return (torch.nn.functional.rms_norm(out.float(), (64,)), pool.sum(dim=(1, 2, 3)))

    return fn, lambda: (torch.tensor(1.5), backing.clone().as_strided(pool.shape, pool.stride()), idx)


def _verify_step():
    t = gdn_inputs(B=3, T=4, seed=4)

    def fn(pool, buf, idx):
        out, _ = ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, idx, t["A_log"], t["a"], t["dt_bias"],
                                          t["b"], intermediate_states_buffer=buf, disable_state_update=True)
        return (out * 2, buf[:, 1].sum())

    pool = torch.randn(5, 4, 64, 64)
    return fn, lambda: (pool.clone(), torch.zeros(3, 4, 4, 64, 64), torch.tensor([4, 0, 2]))


def _replay_verify_step():
    t = gdn_inputs(B=3, T=4, seed=6)

    def fn(pool, rv, rk, g, beta, idx):
        out, _ = ops.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, idx, t["A_log"], t["a"], t["dt_bias"],
                                          t["b"], disable_state_update=True, cache_replayssm=True, replayssm_rawv=rv,
                                          replayssm_rawk=rk, replayssm_g=g, replayssm_beta=beta)
        return (out * 2, g.sum())

    pool = torch.randn(5, 4, 64, 64)
    return fn, lambda: (pool.clone(), torch.zeros(5, 4, 4, 64, dtype=torch.bfloat16),
                        torch.zeros(5, 2, 4, 64, dtype=torch.bfloat16), torch.zeros(5, 4, 4), torch.zeros(5, 4, 4),
                        torch.tensor([4, 0, 2], dtype=torch.int32))


def _replay_commit_step():
    args = _commit_args(seed=2)

    def fn(ck, idx, acc):
        ops.gated_delta_rule_replayssm_commit(ck, *args[1:5], idx, acc)
        return (ck.sum(),)

    return fn, lambda: (args[0].clone(), args[5].clone(), args[6].clone())


def _kmajor_step():
    t = gdn_inputs(B=2, T=1, layout="kmajor", seed=5)

    def fn(state):
        out = torch.empty(2, 1, 4, 64)
        ops.gated_delta_rule_decode(t["q"], t["k"], t["v"], state, t["A_log"], t["a"], t["dt_bias"], t["b"],
                                    output=out, use_qk_l2norm=False)
        return (out + 1,)

    return fn, lambda: (t["state"].clone(),)


def _nvfp4_step():
    a = (torch.randn(40, 64) * 2).to(torch.bfloat16)

    def fn(x, gs):
        fp4, sf = ops.nvfp4_quantize(x * 2, gs, 0)
        return (fp4, sf, ops.dequantize_nvfp4(fp4, sf, gs, 0))

    return fn, lambda: (a.clone(), torch.tensor([50.0]))


def _nvfp4_per_token_step():
    """Per-token scales with the 4over6 search and an out_scale, traced whole (the op's third output)."""
    from gdnjit.nvfp4 import FourOverSix

    a = (torch.randn(40, 64) * 2).to(torch.float16)

    def fn(x, gsi):
        fp4, sf, pts = ops.nvfp4_quantize(x * 2, gsi, 0, per_token_activation=True, out_scale=0.5,
                                          nvfp4_4over6=FourOverSix("mse"))
        return (fp4, sf, pts * 2)

    return fn, lambda: (a.clone(), torch.tensor([1 / 2688]))


STEPS = {"decode-pool": _decode_step, "verify": _verify_step, "replay-verify": _replay_verify_step,
         "replay-commit": _replay_commit_step, "kmajor": _kmajor_step, "nvfp4": _nvfp4_step,
         "nvfp4-per-token": _nvfp4_per_token_step}


@pytest.mark.parametrize("step", list(STEPS))
def test_compile_fullgraph_matches_eager_cpu(step):
    fn, make = STEPS[step]()
    _compiled_matches_eager(fn, make, "aot_eager")


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
def test_compile_inductor_matches_eager_cpu():
    fn, make = _decode_step()
    _compiled_matches_eager(fn, make, "inductor", exact=False)
