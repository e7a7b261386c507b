"""NVFP4 API argument checks on the CPU: every bad argument gives the documented exception type with a
message naming the argument, before any kernel could run (``nvfp4.prepare(require_cuda=False, arch=...)``
runs every check except the CUDA-device one on CPU tensors)."""

from __future__ import annotations

import enum

import pytest
import torch

import gdnjit
from gdnjit import nvfp4
from gdnjit.reference.nvfp4 import dequantize_reference, quantize_reference
from gdnjit.sf_layout import SfLayout


def prep(a=None, gs=1.0, arch="sm_90", **kw):
    if a is None:
        a = torch.randn(5, 64, dtype=torch.bfloat16)
    return nvfp4.prepare(a, gs, require_cuda=False, arch=arch, **kw)


class ForeignSfLayout(enum.Enum):  # stands in for flashinfer.SfLayout (a plain Enum)
    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


def test_exports():
    assert gdnjit.nvfp4_quantize is nvfp4.nvfp4_quantize
    assert gdnjit.SfLayout is SfLayout
    assert gdnjit.dequantize_nvfp4 is nvfp4.dequantize_nvfp4
    assert {"nvfp4_quantize", "SfLayout", "dequantize_nvfp4"} <= set(dir(gdnjit))


def test_valid_call_params_and_args():
    a = torch.randn(5, 64, dtype=torch.bfloat16)
    fp4, sf, call = prep(a, 2.0)
    assert fp4.shape == (5, 32) and fp4.dtype == torch.uint8
    assert sf.shape == (128, 4) and sf.dtype == torch.uint8
    assert call.params == dict(in_dtype="bf16", sf_layout="128x4", K=64, hw_e2m1=False, pdl=True, recipe="fast",
                               scale="tensor", four_over_six="off")
    assert call.facts == {"M": 5} and call.device == 0 and call.pdl is True
    named = call.args
    assert named["x"] == a.data_ptr() and named["q"] == fp4.data_ptr() and named["sf"] == sf.data_ptr()
    assert named["gs_ptr"] == 0 and named["gs_value"] == 2.0
    assert named["x_stride"] == 64 and named["M"] == 5 and named["sf_rows"] == 128
    assert named["pts"] == 0 and named["perm"] == 0 and named["osc_ptr"] == 0 and named["err_denom"] == 2688.0


def test_per_token_call_params_and_args():
    a = torch.randn(5, 64, dtype=torch.float16)
    fp4, sf, pts, call = prep(a, 1 / 1536, per_token=True, four_over_six=nvfp4.FourOverSix("mse", True, 256),
                              recipe="exact")
    assert fp4.shape == (5, 32) and sf.shape == (128, 4) and pts.shape == (5,) and pts.dtype == torch.float32
    assert call.params["scale"] == "token" and call.params["four_over_six"] == "mse_fp16"
    assert call.params["recipe"] == "exact" and call.params["in_dtype"] == "fp16"
    named = call.args
    assert named["pts"] == pts.data_ptr() and named["perm"] == 0 and named["osc_ptr"] == 0
    assert named["err_denom"] == 1536.0 and named["gs_value"] == pytest.approx(1 / 1536)
    # a row map: its tensor is the kernel's, and the outputs start zeroed (rows it leaves out stay 0)
    perm = torch.tensor([4, -1, 0, 2, 1], dtype=torch.int32)
    fp4, sf, pts, call = prep(a, 1 / 2688, per_token=True, row_map=perm, out_scale=2.0)
    assert call.args["perm"] == perm.data_ptr() and call.args["osc_ptr"] == 0 and call.args["osc_value"] == 2.0
    osc = torch.tensor([0.5])
    call = prep(a, 1 / 2688, per_token=True, out_scale=osc)[3]
    assert call.args["osc_ptr"] == osc.data_ptr() and call.args["osc_value"] == 1.0
    assert prep(a, 1 / 2688, per_token=True)[3].args["osc_value"] == 1.0  # none: an exact identity
    assert prep(a, 1 / 2688, per_token=True, out_scale=1e39)[3].args["osc_value"] == float("inf")
    assert not fp4.any() and not sf.any() and not pts.any()
    for bad, exc, needle in ((perm.long(), TypeError, "expanded_idx_to_permuted_idx: expected dtype int32"),
                             (perm[:4], ValueError, "at least 5 entries"),
                             (perm.view(5, 1), ValueError, "1-D tensor"),
                             (torch.arange(10, dtype=torch.int32)[::2], ValueError, "contiguous")):
        with pytest.raises(exc, match=needle):
            prep(a, 1 / 2688, per_token=True, row_map=bad)
    with pytest.raises(TypeError, match="out_scale: expected"):
        prep(a, 1 / 2688, per_token=True, out_scale="2")
    with pytest.raises(ValueError, match="out_scale: expected a one-element"):
        prep(a, 1 / 2688, per_token=True, out_scale=torch.ones(2))
    for kw in (dict(per_token=True), dict(four_over_six=nvfp4.FourOverSix())):
        with pytest.raises(TypeError, match="a: per-token scales and 4over6 take float16 or bfloat16"):
            prep(a.to(torch.float8_e4m3fn), 1.0, **kw)


def test_hw_e2m1_follows_arch():
    for arch, hw in (("sm_89", False), ("sm_90", False), ("sm_100a", True), ("sm_103a", True), ("sm_120a", True)):
        assert prep(arch=arch)[2].params["hw_e2m1"] is hw


@pytest.mark.parametrize("layout,shape", [
    (SfLayout.layout_128x4, (128, 4)), (SfLayout.layout_8x4, (8, 4)), (SfLayout.layout_linear, (5, 3)),
    ("8x4", (8, 4)), (2, (5, 3)), ("layout_128x4", (128, 4)), (ForeignSfLayout.layout_8x4, (8, 4)),
])
def test_layouts_and_padded_shapes(layout, shape):
    fp4, sf, call = prep(torch.randn(5, 48, dtype=torch.float16), sfLayout=layout)
    assert sf.shape == shape and fp4.shape == (5, 24)


def test_strided_rows_flattening_and_dtypes():
    base = torch.randn(6, 200, dtype=torch.bfloat16)
    _, _, call = prep(base[:, 8:136])  # K = 128, row stride 200 elements (400 bytes)
    assert call.args["x_stride"] == 200 and call.params["K"] == 128
    x3 = torch.randn(2, 3, 256, dtype=torch.float16)
    fp4, sf, call = prep(x3, sfLayout="linear")
    assert fp4.shape == (6, 128) and sf.shape == (6, 16) and call.facts == {"M": 6} and call.params["in_dtype"] == "fp16"
    x8 = torch.randn(4, 32).to(torch.float8_e4m3fn)
    assert prep(x8)[2].params["in_dtype"] == "fp8e4m3"
    row = torch.randn(1, 16, dtype=torch.bfloat16)
    assert prep(row)[2].facts == {"M": 1}


def test_global_scale_tensor_and_float():
    gs = torch.tensor([3.0])
    args = prep(gs=gs)[2].args
    assert args["gs_ptr"] == gs.data_ptr() and args["gs_value"] == 0.0
    args = prep(gs=torch.tensor(0.5))[2].args  # 0-dim works too
    assert args["gs_ptr"] != 0
    args = prep(gs=3)[2].args
    assert args["gs_ptr"] == 0 and args["gs_value"] == 3.0
    args = prep(gs=0.1)[2].args
    assert args["gs_value"] == torch.tensor(0.1, dtype=torch.float32).item()  # rounded to float32 on the host


def test_empty_input_needs_no_launch():
    fp4, sf, call = prep(torch.randn(0, 64, dtype=torch.bfloat16))
    assert call is None and fp4.shape == (0, 32) and sf.shape == (0, 4)
    fp4, sf, call = prep(torch.randn(2, 0, 64, dtype=torch.bfloat16), sfLayout="linear")
    assert call is None and sf.shape == (0, 4)


@pytest.mark.parametrize("arch,enable_pdl,expected", [
    ("sm_90", None, True), ("sm_90", True, True), ("sm_90", False, False),      # None: on where supported
    ("sm_100a", None, True), ("sm_100a", False, False),
    ("sm_89", None, False), ("sm_89", False, False),                            # no griddepcontrol before sm_90
])
def test_enable_pdl_selects_the_pdl_variant_and_launch(arch, enable_pdl, expected):
    """enable_pdl decides both the compiled variant (param ``pdl``: the kernel waits on griddepcontrol) and
    the launch (with the programmatic-serialization attribute): the two always agree."""
    call = prep(arch=arch, enable_pdl=enable_pdl)[2]
    assert call.params["pdl"] is expected
    assert call.pdl is expected


def test_enable_pdl_true_refused_before_sm_90():
    with pytest.raises(ValueError, match=r"enable_pdl: True needs compute capability 9\.0"):
        prep(arch="sm_89", enable_pdl=True)


_BAD = [
    (dict(a=[[1.0] * 16]), TypeError, "a: expected a torch.Tensor"),
    (dict(a=torch.randn(4, 64)), TypeError, "a: expected dtype float16, bfloat16 or float8_e4m3fn"),
    (dict(a=torch.randn(4, 64, dtype=torch.float64)), TypeError, "a: expected dtype"),
    (dict(a=torch.randn(64, dtype=torch.bfloat16)), ValueError, "a: expected at least 2 dims"),
    (dict(a=torch.randn(4, 40, dtype=torch.bfloat16)), ValueError, "a: the last dim K must be a positive multiple of 16"),
    (dict(a=torch.randn(4, 0, dtype=torch.bfloat16)), ValueError, "a: the last dim K must be a positive multiple"),
    (dict(a=torch.randn(64, 8, dtype=torch.bfloat16).t()), ValueError, "a: the last dimension must be contiguous"),
    (dict(a=torch.randn(4, 6, 64, dtype=torch.bfloat16).transpose(0, 1)), ValueError, "cannot be viewed as rows"),
    (dict(a=torch.randn(4, 80, dtype=torch.bfloat16)[:, 4:68]), ValueError, "a: data pointer must be 16-byte aligned"),
    (dict(a=torch.randn(4, 68, dtype=torch.bfloat16)[:, :64]), ValueError, "a: stride of dim 0 must be a multiple of 16"),
    (dict(gs=torch.tensor([1.0, 2.0])), ValueError, "a_global_sf: expected a one-element tensor"),
    (dict(gs=torch.tensor([1], dtype=torch.int32)), TypeError, "a_global_sf: expected a float dtype, got int32"),
    (dict(gs=torch.empty(1, device="meta")), ValueError, "a_global_sf: expected a tensor with a value"),
    (dict(gs="1.0"), TypeError, "a_global_sf: expected a one-element float32 tensor or a Python float"),
    (dict(gs=None), TypeError, "a_global_sf: expected"),
    (dict(gs=True), TypeError, "a_global_sf: expected"),
    (dict(gs=0.0), ValueError, "a_global_sf: expected a finite value > 0"),
    (dict(gs=-2.0), ValueError, "a_global_sf: expected a finite value > 0"),
    (dict(gs=float("inf")), ValueError, "a_global_sf: expected a finite value > 0"),
    (dict(gs=float("nan")), ValueError, "a_global_sf: expected a finite value > 0"),
    (dict(gs=1e39), ValueError, "a_global_sf: expected a finite value > 0 (as float32)"),
    (dict(gs=1e-50), ValueError, "a_global_sf: expected a finite value > 0 (as float32)"),
    (dict(sfLayout=7), ValueError, "sfLayout: expected an SfLayout"),
    (dict(sfLayout="16x4"), ValueError, "sfLayout: expected an SfLayout"),
    (dict(sfLayout=True), ValueError, "sfLayout"),
    (dict(sfLayout=None), ValueError, "sfLayout"),
    (dict(sf_vec_size=32), ValueError, "sf_vec_size: only 16"),
    (dict(sf_vec_size=8), ValueError, "sf_vec_size: only 16"),
    (dict(sf_vec_size="16"), TypeError, "sf_vec_size: expected an int"),
    (dict(sf_vec_size=16.0), TypeError, "sf_vec_size: expected an int"),
    (dict(do_shuffle=True), ValueError, "do_shuffle: True is not supported"),
    (dict(do_shuffle=1), TypeError, "do_shuffle: expected a bool"),
    (dict(enable_pdl=1), TypeError, "enable_pdl: expected None or a bool"),
    (dict(enable_pdl="yes"), TypeError, "enable_pdl: expected None or a bool"),
    (dict(backend="cutlass"), ValueError, "backend: expected one of ['gdnjit', 'cuda', 'cute-dsl', 'reference']"),
    (dict(backend="cake"), NotImplementedError, "backend='cake'"),
    (dict(backend=None), ValueError, "backend: expected one of"),
    (dict(arch="sm_80"), ValueError, "compute capability 8.9"),
    (dict(arch="sm_86"), ValueError, "compute capability 8.9"),
]


@pytest.mark.parametrize("over,exc,needle", _BAD, ids=[n[:40] for _, _, n in _BAD])
def test_argument_errors(over, exc, needle):
    with pytest.raises(exc) as info:
        prep(**over)
    assert needle in str(info.value)


@pytest.mark.parametrize("K", [80, 96, 7680, 16 * 997, 2**20])
def test_any_multiple_of_16_is_a_variant(K):
    """K is compile-time, but not limited to a list: any multiple of 16 in the spec's domain makes a call
    (and a variant) with that K; the spec's K list is only what checks and warm enumerate."""
    assert K not in gdnjit.spec.get_spec("nvfp4_quantize").allowed("K") or K == 2**20 or K == 96
    fp4, sf, call = prep(torch.randn(2, K, dtype=torch.float16))
    assert call.params["K"] == K and fp4.shape == (2, K // 2)
    from gdnjit.variant import Variant

    v = Variant.make(call.spec, call.params, {"blocks_per_thread": 1, "threads": 128}, "sm_90")
    assert f"constexpr int K = {K};" in v.source()


def test_k_beyond_the_domain_is_refused():
    with pytest.raises(ValueError, match=r"a: the last dim K must satisfy K % 16 == 0 and 16 <= K <= 1048576 "
                                         r"\(gdnjit/specs/nvfp4_quantize.yaml\), got K=1048592"):
        prep(torch.empty(1, 2**20 + 16, dtype=torch.float16))


def test_public_api_refuses_cpu_tensors():
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):
        gdnjit.nvfp4_quantize(torch.randn(4, 64, dtype=torch.bfloat16), 1.0)


def test_public_api_checks_options_before_the_device():
    # option errors name their argument even for the reference backend
    a = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do_shuffle"):
        gdnjit.nvfp4_quantize(a, 1.0, do_shuffle=True, backend="reference")
    with pytest.raises(ValueError, match="sf_vec_size"):
        gdnjit.nvfp4_quantize(a, 1.0, sf_vec_size=32, backend="reference")
    with pytest.raises(ValueError, match="backend"):
        gdnjit.nvfp4_quantize(a, 1.0, backend="triton")


def test_reference_backend_and_dequantize_helper():
    torch.manual_seed(0)
    a = torch.randn(3, 2, 64, dtype=torch.bfloat16) * 10
    gs = torch.tensor([448 * 6 / float(a.float().abs().max())])
    for layout in (SfLayout.layout_128x4, "8x4", 2):
        fp4, sf = gdnjit.nvfp4_quantize(a, gs, layout, backend="reference")
        ref_fp4, ref_sf = quantize_reference(a, gs, layout)
        assert torch.equal(fp4, ref_fp4) and torch.equal(sf, ref_sf)
        deq = gdnjit.dequantize_nvfp4(fp4, sf, gs, layout)  # m, k from fp4's shape
        assert torch.equal(deq, dequantize_reference(fp4, sf, gs, layout, 6, 64))
        assert deq.shape == (6, 64)
        assert torch.equal(gdnjit.dequantize_nvfp4(fp4, sf, gs, layout, 6, 64), deq)
    with pytest.raises(ValueError, match="m, k: required"):
        gdnjit.dequantize_nvfp4(fp4.view(-1), sf, gs, "linear")


def test_enable_pdl_resolution():
    """None / True: the PDL variant (params[-1]) launched with PDL where supported (sm_90+);
    False: neither; True below sm_90 is refused, not ignored."""
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    for pdl, want in ((None, True), (False, False), (True, True)):
        call = prep(x, enable_pdl=pdl)[2]
        assert call.pdl is want and call.params["pdl"] is want
    assert prep(x, arch="sm_89")[2].pdl is False
    with pytest.raises(ValueError, match="enable_pdl"):
        prep(x, arch="sm_89", enable_pdl=True)
    with pytest.raises(TypeError, match="enable_pdl"):
        prep(x, enable_pdl=1)


def test_too_many_rows_for_32_bit_offsets():
    """The kernel indexes the padded scale buffer with 32-bit offsets: a call past 2^32 - 2^12 scale bytes is
    refused before anything is allocated (an expanded row: no memory behind the 2^28 rows)."""
    K = 256  # 16 blocks -> 16 scale bytes per row in every layout
    rows = (2**32 - 2**12) // 16 + 1  # one row past the bound (a call at the bound would allocate 32 GB)
    with pytest.raises(ValueError) as info:
        prep(torch.zeros(1, K, dtype=torch.bfloat16).expand(rows, K), sfLayout=SfLayout.layout_linear)
    assert "too many for one call" in str(info.value) and f"{rows} rows of K={K}" in str(info.value)


def test_global_scale_of_another_float_dtype_is_converted():
    """FlashInfer converts a bf16 / fp16 / fp64 global scale to float32 on the input's device (issue #3398 there);
    so does gdnjit: the kernel then reads the converted copy."""
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        gs = torch.tensor([3.0], dtype=dt)
        call = prep(torch.randn(5, 64, dtype=torch.bfloat16), gs)[2]
        assert call.args["gs_ptr"] != 0 and call.args["gs_ptr"] != gs.data_ptr()
    zero_dim = torch.tensor(3.0)
    assert prep(torch.randn(5, 64, dtype=torch.bfloat16), zero_dim)[2].args["gs_ptr"] == zero_dim.data_ptr()


def test_recipe_switch_follows_flashinfer(monkeypatch):
    """fast unless FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH (or TRTLLM_...) is exactly "1", read per call; the
    explicit fast_math argument wins; fp8 input is always fast."""
    seen = []
    monkeypatch.setattr(nvfp4, "prepare", lambda *a, **kw: seen.append(kw["recipe"]) or (None, None, None))
    a = torch.randn(5, 64, dtype=torch.bfloat16)
    for env, want in ((None, "fast"), ("1", "exact"), ("true", "fast"), ("0", "fast")):
        monkeypatch.delenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", raising=False)
        if env is not None:
            monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", env)
        nvfp4.nvfp4_quantize(a, 1.0)
        assert seen[-1] == want, env
    monkeypatch.delenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH")
    monkeypatch.setenv("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH", "1")
    nvfp4.nvfp4_quantize(a, 1.0)
    assert seen[-1] == "exact"
    nvfp4.nvfp4_quantize(a, 1.0, fast_math=True)
    assert seen[-1] == "fast"
    monkeypatch.delenv("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
    nvfp4.nvfp4_quantize(a, 1.0, fast_math=False)
    assert seen[-1] == "exact"
    nvfp4.nvfp4_quantize(a.to(torch.float8_e4m3fn), 1.0, fast_math=False)
    assert seen[-1] == "fast"
    with pytest.raises(TypeError, match="fast_math: expected None or a bool"):
        nvfp4.nvfp4_quantize(a, 1.0, fast_math=1)


class ForeignConfig:  # stands in for FlashInfer's NVFP44Over6Config (err_mode: a str or its IntEnum)
    def __init__(self, e4m3_max=448, err_mode="MAE", err_use_fast_math=False):
        self.e4m3_max, self.err_mode, self.err_use_fast_math = e4m3_max, err_mode, err_use_fast_math


@pytest.mark.parametrize("kw,exc,needle", [
    (dict(per_token_activation=1), TypeError, "per_token_activation: expected a bool"),
    (dict(expanded_idx_to_permuted_idx=torch.zeros(5, dtype=torch.int32)), ValueError,
     "expanded_idx_to_permuted_idx: only with per_token_activation"),
    (dict(out_scale=torch.ones(1)), ValueError, "out_scale: only with per_token_activation"),
    (dict(per_token_activation=True, out_scale=torch.ones(1), backend="cuda"), ValueError, "out_scale: only with backend"),
    (dict(per_token_activation=True, expanded_idx_to_permuted_idx=torch.zeros(5, dtype=torch.int32),
          backend="cute-dsl"), ValueError, "expanded_idx_to_permuted_idx: not with backend 'cute-dsl'"),
    (dict(nvfp4_4over6=object()), TypeError, "nvfp4_4over6: expected None, a FourOverSix"),
    (dict(nvfp4_4over6=ForeignConfig(err_mode="MAX")), ValueError, "err_mode expected MAE or MSE"),
    (dict(nvfp4_4over6=ForeignConfig(e4m3_max=300)), ValueError, "e4m3_max 256 / 448"),
    (dict(nvfp4_4over6=nvfp4.FourOverSix("mae", 1)), ValueError, "a bool err_use_fast_math"),
])
def test_flashinfer_extras_refused_with_a_reason(kw, exc, needle):
    a = torch.randn(5, 64, dtype=torch.bfloat16)
    with pytest.raises(exc, match=needle):
        nvfp4.nvfp4_quantize(a, 1.0, **kw)


def test_fp4_quantize_maps_flashinfers_flags(monkeypatch):
    seen = []

    def fake(a, gs, layout, shuffle, vec, pdl, backend, **kw):
        seen.append((layout, gs, kw["fast_math"]))
        return torch.zeros(a.numel() // a.shape[-1], a.shape[-1] // 2, dtype=torch.uint8), torch.zeros(1)

    monkeypatch.setattr(nvfp4, "nvfp4_quantize", fake)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    gs = torch.tensor([4.0])
    fp4, _ = nvfp4.fp4_quantize(x, gs)
    assert fp4.shape == (2, 3, 32) and seen[-1][0] == SfLayout.layout_128x4
    nvfp4.fp4_quantize(x, gs, 16, False, True, True)
    assert seen[-1][0] == SfLayout.layout_8x4
    nvfp4.fp4_quantize(x, gs, 16, False, False, fast_math=False)
    assert seen[-1][0] == SfLayout.layout_linear and seen[-1][2] is False
    nvfp4.fp4_quantize(x, gs, is_global_scale_inversed=True)
    assert float(seen[-1][1]) == 0.25
    for kw, exc, needle in ((dict(sf_vec_size=32), NotImplementedError, "MXFP4"),
                            (dict(sf_use_ue8m0=True), NotImplementedError, "MXFP4"),
                            (dict(sf_vec_size=8), NotImplementedError, "sf_vec_size: can only be 16 or 32"),
                            (dict(backend="gdnjit"), ValueError, "backend: expected 'cuda' or 'cute-dsl'"),
                            (dict(global_scale=None), ValueError, "global_scale: required"),
                            (dict(global_scale=torch.ones(6)), NotImplementedError, "row-wise global scale")):
        with pytest.raises(exc, match=needle):
            nvfp4.fp4_quantize(x, **dict(dict(global_scale=gs), **kw))


def test_flashinfers_4over6_switch_and_argument(monkeypatch):
    """FlashInfer's environment switch is read per call when the argument is omitted; an explicit value (None, a
    FourOverSix, FlashInfer's config by its fields) wins; fp8 input ignores the environment and refuses an explicit
    recipe; an explicit recipe checks a per-token float scale against 1 / (e4m3_max * 6)."""
    a = torch.randn(5, 64, dtype=torch.bfloat16)
    seen = []
    monkeypatch.setattr(nvfp4, "prepare", lambda *args, **kw: (seen.append(kw["four_over_six"]), None, None, None)[1:])
    for name in nvfp4.FOUR_OVER_SIX_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "0")
    nvfp4.nvfp4_quantize(a, 1.0)
    assert seen[-1] is None
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    nvfp4.nvfp4_quantize(a, 1.0)
    assert seen[-1] == nvfp4.FourOverSix("mae", False, 448)
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "mse")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_E4M3_USE_256", "1")
    nvfp4.nvfp4_quantize(a, 1.0)
    assert seen[-1] == nvfp4.FourOverSix("mse", True, 256)
    nvfp4.nvfp4_quantize(a, 1.0, nvfp4_4over6=None)  # an explicit None wins over the environment
    assert seen[-1] is None
    nvfp4.nvfp4_quantize(a, 1.0, nvfp4_4over6=ForeignConfig(448, enum.IntEnum("M", "MAE MSE", start=0).MSE))
    assert seen[-1] == nvfp4.FourOverSix("mse", False, 448)
    nvfp4.nvfp4_quantize(a.to(torch.float8_e4m3fn), 1.0)  # the environment's recipe: not for fp8
    assert seen[-1] is None
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "abs")
    with pytest.raises(ValueError, match="FLASHINFER_NVFP4_4OVER6_ERR_MODE: expected MAE or MSE"):
        nvfp4.nvfp4_quantize(a, 1.0)
    with pytest.raises(ValueError, match="nvfp4_4over6: NVFP4 4over6 requires float16 or bfloat16 input"):
        nvfp4.nvfp4_quantize(a.to(torch.float8_e4m3fn), 1.0, nvfp4_4over6=nvfp4.FourOverSix())
    with pytest.raises(ValueError, match="a_global_sf: 0.0003720238095238095 does not match"):
        nvfp4.nvfp4_quantize(a, 1 / 2688, per_token_activation=True, nvfp4_4over6=nvfp4.FourOverSix(e4m3_max=256))
    nvfp4.nvfp4_quantize(a, 1 / 1536, per_token_activation=True, nvfp4_4over6=nvfp4.FourOverSix(e4m3_max=256))
    nvfp4.nvfp4_quantize(a, 1 / 2688, per_token_activation=True, nvfp4_4over6=None)
