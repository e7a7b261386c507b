"""Tests of the NVFP4 quantization reference and the scale-factor layouts (CPU only)."""

from __future__ import annotations

import bisect
import math
import os
import struct
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnjit.reference.nvfp4 import (
    dequantize_reference,
    e2m1_decode,
    e2m1_satfinite_rne,
    e4m3_decode,
    e4m3_satfinite_rne,
    quantize_reference,
)
from gdnjit.sf_layout import SfLayout, padded_sf_shape, sf_offsets, to_sf_layout

LAYOUTS = list(SfLayout)
# hypothesis tests: at depth in the full test tier (GDNJIT_TEST_FULL=1, tests/conftest.py), a sample by default
FULL_TIER = os.environ.get("GDNJIT_TEST_FULL", "").strip() not in ("", "0")
DTYPES = [torch.float16, torch.bfloat16, torch.float8_e4m3fn]

# ----------------------------------------------------------------------------------------------
# Independent scalar oracles (Python floats; fp32 rounding emulated with struct, which is exact:
# a product of two fp32 values is exact in double, and double rounding of a quotient from double
# to float is innocuous since 53 >= 2*24 + 2).


def f32(v: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:  # beyond float32: rounds to inf
        return math.copysign(math.inf, v)


def f16(v: float) -> float:
    try:
        return struct.unpack("e", struct.pack("e", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _e4m3_value(code: int) -> float:
    e, m = code >> 3, code & 7
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_POS = [_e4m3_value(c) for c in range(0x7F)]  # codes 0..0x7E, increasing values
E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nearest_even_code(table: list[float], v: float) -> int:
    """Index of the table value nearest to v >= 0; ties to the even index; above max: max."""
    if v >= table[-1]:
        return len(table) - 1
    i = bisect.bisect_left(table, v)
    if table[i] == v:
        return i
    lo, hi = i - 1, i
    d_lo, d_hi = v - table[lo], table[hi] - v
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return lo if lo % 2 == 0 else hi


def e2m1_code_scalar(y: float, negative: bool) -> int:
    mag = 7 if math.isnan(y) else nearest_even_code(E2M1_POS, abs(y))
    return mag | (8 if negative else 0)


FLT_MAX = f32(3.4028234663852886e38)


def quantize_block_scalar(block: list[float], gs: float, recipe: str = "fast", fp8: bool = False) -> tuple[int, list[int]]:
    """Scalar NVFP4 of one 16-element block (finite values): (sf byte, 16 codes). Written from the formulas of
    docs/design.md section 5, one float32 rounding per operation: FlashInfer's fast and exact (TransformerEngine)
    recipes, and its fp8 path (pre-scale to fp16, fast recipe, out_scale gs * (1 / sf))."""
    rgs = f32(1.0 / gs)
    if fp8:
        pre = f32(6.0 * rgs)
        block = [f16(f32(v * pre)) for v in block]
    amax = max(abs(v) for v in block)
    sixth = f32(1.0 / 6.0)
    exact = recipe == "exact" and not fp8
    sf_f = f32(amax * f32(gs * sixth)) if exact else f32(gs * f32(amax * sixth))
    sf_code = nearest_even_code(E4M3_POS, min(sf_f, 448.0))
    sf_v = E4M3_POS[sf_code]
    if exact:
        out_scale = FLT_MAX if sf_v == 0 else min(f32(1.0 / f32(sf_v * rgs)), FLT_MAX)
    elif fp8:
        out_scale = 0.0 if sf_f == 0 else (math.inf if sf_v == 0 else f32(gs * f32(1.0 / sf_v)))
    else:
        out_scale = 0.0 if sf_v == 0 else f32(1.0 / f32(sf_v * rgs))
    codes = []
    for v in block:
        y = v * out_scale if not (v == 0 and math.isinf(out_scale)) else math.nan  # 0 * inf: NaN, as on the GPU
        codes.append(e2m1_code_scalar(f32(y) if not math.isnan(y) else y, math.copysign(1.0, v) < 0))
    return sf_code, codes


def e4m3_bits_bitlevel(x: torch.Tensor) -> torch.Tensor:
    """Hand-written e4m3 RNE from the fp32 bits; x finite with |x| <= 448."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    sign = ((bits >> 31) & 1) << 7
    mag = bits & 0x7FFFFFFF
    exp, mant = mag >> 23, mag & 0x7FFFFF
    # normal e4m3 (|x| >= 2^-6): keep exp + 3 mantissa bits, round the 20 dropped bits
    q, rem = mag >> 20, mag & 0xFFFFF
    up = (rem > 0x80000) | ((rem == 0x80000) & (q & 1 == 1))
    normal = q + up.long() - (120 << 3)
    # subnormal e4m3: |x| / 2^-9 = sig * 2^(e_eff - 141), rounded half-even to an integer
    sig = torch.where(exp > 0, mant | (1 << 23), mant)
    shift = (141 - exp.clamp(min=1)).clamp(max=30)
    ipart = sig >> shift
    srem = sig - (ipart << shift)
    half = torch.ones_like(shift) << (shift - 1)
    sub = ipart + ((srem > half) | ((srem == half) & (ipart & 1 == 1))).long()
    return (torch.where(exp >= 121, normal, sub) | sign).to(torch.uint8)


def unpack_codes(fp4: torch.Tensor) -> torch.Tensor:
    return torch.stack((fp4 & 0xF, fp4 >> 4), dim=-1).reshape(fp4.shape[0], -1)


def gathered_sf(sf: torch.Tensor, m: int, k: int, layout) -> torch.Tensor:
    return sf.reshape(-1)[sf_offsets(m, k // 16, layout).view(-1)].view(m, k // 16)


# ----------------------------------------------------------------------------------------------
# e4m3 / e2m1 conversions


def _e4m3_probe_values() -> torch.Tensor:
    pos = torch.tensor(E4M3_POS, dtype=torch.float32)
    mids = (pos[1:] + pos[:-1]) / 2  # exact in fp32: every tie
    inf = torch.tensor(float("inf"))
    around = torch.cat([torch.nextafter(mids, inf), torch.nextafter(mids, -inf)])
    lo, hi = struct.unpack("i", struct.pack("f", 2.0**-12))[0], struct.unpack("i", struct.pack("f", 448.0))[0]
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(lo, hi + 1, (200_000,), generator=g, dtype=torch.int32).view(torch.float32)
    tiny = torch.tensor([0.0, 2.0**-10, 2.0**-10 * 1.0000001, 2.0**-11, 1e-30, 1.5 * 2.0**-9, 2.5 * 2.0**-9, 2.0**-6])
    allv = torch.cat([pos, mids, around, rand, tiny]).clamp(max=448.0)
    return torch.cat([allv, -allv])


def test_torch_e4m3_conversion_matches_bitlevel_rne():
    x = _e4m3_probe_values()
    assert torch.equal(e4m3_satfinite_rne(x), e4m3_bits_bitlevel(x))


def test_bitlevel_e4m3_matches_table_oracle():
    x = _e4m3_probe_values()[::37]
    got = e4m3_bits_bitlevel(x).tolist()
    want = [nearest_even_code(E4M3_POS, abs(v)) | (0x80 if math.copysign(1, v) < 0 else 0) for v in x.tolist()]
    assert got == want


def test_e4m3_ties_and_saturation_by_hand():
    cases = [  # (value, bits); a list, since -0.0 == 0.0 as dict keys
        (1.0, 0x38), (1.0625, 0x38), (1.1875, 0x3A), (2.0**-10, 0x00), (3 * 2.0**-10, 0x02), (2.0**-6, 0x08),
        (448.0, 0x7E), (449.0, 0x7E), (463.9, 0x7E), (464.0, 0x7E), (470.0, 0x7E), (1e30, 0x7E),
        (float("inf"), 0x7E), (-470.0, 0xFE), (float("-inf"), 0xFE), (-0.0, 0x80), (0.0, 0x00),
    ]
    x = torch.tensor([v for v, _ in cases], dtype=torch.float32)
    assert e4m3_satfinite_rne(x).tolist() == [b for _, b in cases]
    assert e4m3_satfinite_rne(torch.tensor([float("nan")])).tolist() == [0x7F]
    assert e4m3_decode(torch.tensor([0x38, 0x7E, 0x01, 0xFE], dtype=torch.uint8)).tolist() == [1.0, 448.0, 2.0**-9, -448.0]


def test_e2m1_ties_to_even_by_hand():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0, 2, 2, 4, 4, 6, 6]  # codes of 0, 1, 1, 2, 2, 4, 4
    x = torch.tensor(ties + [-t for t in ties], dtype=torch.float32)
    assert e2m1_satfinite_rne(x).tolist() == want + [c | 8 for c in want]
    more = [(0.0, 0), (-0.0, 8), (0.2, 0), (0.26, 1), (6.0, 7), (6.5, 7), (1e30, 7), (float("inf"), 7),
            (float("-inf"), 15), (-0.1, 8)]
    assert e2m1_satfinite_rne(torch.tensor([v for v, _ in more])).tolist() == [c for _, c in more]
    nan = torch.tensor([float("nan")])
    assert e2m1_satfinite_rne(torch.cat([nan, -nan])).tolist() == [7, 15]


def test_e2m1_matches_oracle_on_fp16_grid():
    grid = torch.arange(0, 0x4A00, dtype=torch.int32).to(torch.int16).view(torch.float16).float()  # [0, 12]
    inf = torch.tensor(float("inf"))
    x = torch.cat([grid, torch.nextafter(grid, inf), torch.nextafter(grid, -inf)])
    x = torch.cat([x, -x])
    want = [e2m1_code_scalar(v, math.copysign(1, v) < 0) for v in x.tolist()]
    assert e2m1_satfinite_rne(x).tolist() == want
    codes = torch.arange(16, dtype=torch.uint8)
    assert e2m1_decode(codes).tolist() == E2M1_POS + [-v for v in E2M1_POS]


# ----------------------------------------------------------------------------------------------
# Hand-worked quantization cases


def _q1(row: list[float], gs, dtype=torch.float16, layout=SfLayout.layout_128x4):
    fp4, sf = quantize_reference(torch.tensor([row], dtype=dtype), gs, layout)
    return unpack_codes(fp4)[0].tolist(), gathered_sf(sf, 1, len(row), layout)[0].tolist()


TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
TIE_CODES = [0, 2, 2, 4, 4, 6, 6]


def test_ties_with_unit_out_scale():
    # gs = 1, amax = 6: amax * f32(1/6) rounds to exactly 1.0, sf = e4m3(1.0) = 0x38, out_scale = 1
    row = [6.0] + TIES + [-t for t in TIES] + [-6.0]
    codes, sf = _q1(row, 1.0)
    assert sf == [0x38]
    assert codes == [7] + TIE_CODES + [c | 8 for c in TIE_CODES] + [15]


def test_ties_with_out_scale_two():
    # gs = 2, amax = 3: sf_f32 = 2 * 0.5 = 1, rgs = 0.5, out_scale = 1 / (1 * 0.5) = 2
    row = [3.0] + [t / 2 for t in TIES] + [-t / 2 for t in TIES] + [0.0]
    codes, sf = _q1(row, torch.tensor([2.0]))
    assert sf == [0x38]
    assert codes == [7] + TIE_CODES + [c | 8 for c in TIE_CODES] + [0]


def test_just_off_the_ties_round_to_nearest():
    ties = torch.tensor(TIES, dtype=torch.float32)  # one fp32 ulp above / below each tie
    up = torch.nextafter(ties, torch.tensor(10.0)).tolist()
    down = torch.nextafter(ties, torch.tensor(-10.0)).tolist()
    row = [6.0] + up + [0.0] * 8
    codes, _ = _q1(row, 1.0, dtype=torch.float32)
    assert codes[1:8] == [1, 2, 3, 4, 5, 6, 7]  # 0.5, 1, 1.5, 2, 3, 4, 6
    row = [6.0] + down + [0.0] * 8
    codes, _ = _q1(row, 1.0, dtype=torch.float32)
    assert codes[1:8] == [0, 1, 2, 3, 4, 5, 6]  # 0, 0.5, 1, 1.5, 2, 3, 4


@pytest.mark.parametrize("amax,gs,want", [
    (0.472900390625, 4.559628009796143, 0x2C),  # (gs * amax) * (1/6) or gs * amax / 6 give 0x2B
    (228.875, 0.08192244917154312, 0x45),  # ... 0x44
    (0.09771728515625, 222.5808868408203, 0x47),  # ... 0x46
])
def test_scale_multiply_order(amax, gs, want):
    # sf = e4m3(gs * f32(amax * f32(1/6))): these (found by search) land on an e4m3 tie otherwise
    _, sf = _q1([amax] + [0.0] * 15, gs)
    assert sf == [want] == [quantize_block_scalar([amax] + [0.0] * 15, f32(gs))[0]]
    wrong = e4m3_satfinite_rne(torch.tensor(gs) * torch.tensor(amax) / 6)
    assert int(wrong) == want - 1


def test_scaled_element_above_six_saturates():
    # amax = 6.375: amax/6 = 1.0625 is an e4m3 tie and rounds down to 1.0, so out_scale = 1
    codes, sf = _q1([6.375, 6.25, -6.375, 5.5] + [0.0] * 12, 1.0)
    assert sf == [0x38]
    assert codes[:4] == [7, 7, 15, 7]


def test_scale_factor_saturates_at_448():
    codes, sf = _q1([6.0, 1.0, 2.0, 0.5, -1.0] + [0.0] * 11, 470.0)  # 470 * 1 > 448 (torch alone gives NaN)
    assert sf == [0x7E]
    # out_scale = 1 / (448 * f32(1/470)) ~ 1.049: 6 -> 6.29 -> 6, 1 -> 1.05 -> 1, 2 -> 2.1 -> 2, 0.5 -> 0.52 -> 0.5
    assert codes[:5] == [7, 2, 4, 1, 10]
    codes, sf = _q1([6.0, 1.0, 2.0, 0.5, -1.0] + [0.0] * 11, 1000.0)
    assert sf == [0x7E]
    assert codes[:5] == [7, 4, 6, 2, 12]  # out_scale ~ 2.232
    codes, sf = _q1([1e-3, -1e-3, 0.0] + [0.0] * 13, 1e30)
    assert sf == [0x7E] and codes[:3] == [7, 15, 0]


def test_all_zero_blocks_and_mixed_row():
    fp4, sf = quantize_reference(torch.zeros(3, 64, dtype=torch.bfloat16), 1.0)
    assert not fp4.any() and not sf.any()
    row = [0.0] * 16 + [6.0] + [0.0] * 15
    codes, sf = _q1(row, 1.0)
    assert sf == [0, 0x38] and codes == [0] * 16 + [7] + [0] * 15


def test_negative_values_rounding_to_zero_keep_the_sign():
    codes, sf = _q1([6.0, -0.1, -0.2, -0.25, -0.0, 0.1] + [0.0] * 10, 1.0)
    assert codes[:6] == [7, 8, 8, 8, 8, 0]
    # a block whose scale rounds to e4m3 zero: out_scale 0, every code is 0x0 / 0x8
    codes, sf = _q1([1e-3, -1e-3, 5e-4, -0.0] + [0.0] * 12, 1.0)
    assert sf == [0] and codes[:4] == [0, 8, 0, 8]


def test_nan_and_inf_handling():
    nan = float("nan")
    # NaN elements are ignored by amax, encode as 6 with their sign
    x = torch.tensor([[6.0, nan, 1.0] + [0.0] * 13], dtype=torch.float16)
    x[0, 3] = -torch.tensor(nan)
    fp4, sf = quantize_reference(x, 1.0)
    assert gathered_sf(sf, 1, 16, 0).tolist() == [[0x38]]
    assert unpack_codes(fp4)[0, :4].tolist() == [7, 7, 2, 15]
    # an all-NaN block: sf is e4m3 NaN, codes are 6 with the element's sign
    x = torch.full((1, 16), nan, dtype=torch.float16)
    x[0, 1::2] = -x[0, 1::2]
    fp4, sf = quantize_reference(x, 1.0)
    assert gathered_sf(sf, 1, 16, 0).tolist() == [[0x7F]]
    assert unpack_codes(fp4)[0].tolist() == [7, 15] * 8
    # Inf: amax = Inf, sf saturates to 448, Inf -> 6, finite values shrink to 0
    codes, sf = _q1([float("inf"), 1.0, float("-inf")] + [0.0] * 13, 1.0)
    assert sf == [0x7E] and codes[:3] == [7, 0, 15]


# ----------------------------------------------------------------------------------------------
# Scale-factor layouts


def _offset_formula(r: int, c: int, n: int, layout: SfLayout) -> int:
    if layout == SfLayout.layout_128x4:
        pc = -(-n // 4) * 4
        return (c % 4) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (r // 128) * (128 * pc)
    if layout == SfLayout.layout_8x4:
        pc = -(-n // 4) * 4
        return (r // 8) * (pc // 4 * 32) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)
    return r * n + c


def test_offsets_hand_computed():
    o = sf_offsets(256, 8, "128x4")
    assert [o[0, 0], o[1, 0], o[32, 0], o[0, 1], o[0, 4], o[128, 0], o[33, 5], o[255, 7]] == [
        0, 16, 4, 1, 512, 1024, 533, 1024 + 512 + 31 * 16 + 3 * 4 + 3]
    o = sf_offsets(16, 8, "8x4")
    assert [o[0, 0], o[1, 0], o[0, 1], o[0, 4], o[8, 0], o[9, 5]] == [0, 4, 1, 32, 64, 101]
    o = sf_offsets(3, 5, "linear")
    assert o.tolist() == [[r * 5 + c for c in range(5)] for r in range(3)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n", [(1, 1), (3, 3), (8, 4), (9, 1), (127, 5), (129, 128), (256, 7)])
def test_offsets_formula_and_bijection(layout, m, n):
    rows, cols = padded_sf_shape(m, n, layout)
    o = sf_offsets(m, n, layout)
    assert o.dtype == torch.int64 and o.shape == (m, n)
    assert o.tolist() == [[_offset_formula(r, c, n, layout) for c in range(n)] for r in range(m)]
    full = sf_offsets(rows, cols, layout)  # the padded grid: a permutation of the buffer
    assert torch.equal(full.flatten().sort().values, torch.arange(rows * cols))
    assert torch.equal(full[:m, :n], o)  # so the real entries map injectively, the rest is padding


def test_padded_shapes():
    assert padded_sf_shape(1, 1, 0) == (128, 4)
    assert padded_sf_shape(129, 5, SfLayout.layout_128x4) == (256, 8)
    assert padded_sf_shape(9, 3, "8x4") == (16, 4)
    assert padded_sf_shape(3, 3, "linear") == (3, 3)
    assert padded_sf_shape(0, 2, 0) == (0, 4)


@pytest.mark.parametrize("value,want", [
    (SfLayout.layout_8x4, SfLayout.layout_8x4), (0, SfLayout.layout_128x4), (2, SfLayout.layout_linear),
    ("128x4", SfLayout.layout_128x4), ("8x4", SfLayout.layout_8x4), ("linear", SfLayout.layout_linear),
    ("layout_128x4", SfLayout.layout_128x4), ("layout_8x4", SfLayout.layout_8x4), ("LAYOUT_LINEAR", SfLayout.layout_linear),
])
def test_layout_spellings(value, want):
    assert to_sf_layout(value) is want


@pytest.mark.parametrize("bad", [3, -1, "4x4", "", None, True, 1.0])
def test_bad_layout(bad):
    with pytest.raises(ValueError, match="sfLayout"):
        to_sf_layout(bad)
    with pytest.raises(ValueError, match="sfLayout"):
        quantize_reference(torch.ones(1, 16, dtype=torch.float16), 1.0, bad)
    with pytest.raises(ValueError, match="sfLayout"):
        sf_offsets(1, 1, bad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_padding_entries_are_zero(layout):
    m, k = 131, 80
    fp4, sf = quantize_reference(torch.ones(m, k, dtype=torch.float16), 1.0, layout)
    assert sf.shape == padded_sf_shape(m, k // 16, layout) and sf.dtype == torch.uint8
    mask = torch.zeros(sf.numel(), dtype=torch.bool)
    mask[sf_offsets(m, k // 16, layout).view(-1)] = True
    flat = sf.view(-1)
    assert bool((flat[mask] == e4m3_satfinite_rne(torch.tensor(1.0 / 6.0))).all())
    assert not flat[~mask].any()


# ----------------------------------------------------------------------------------------------
# Shapes, dtypes, agreement with the scalar oracle, round trip


def _data(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k // 16, 1, generator=g) * 2).repeat_interleave(16, 1).view(m, k)
    return x


def _check_against_scalar(x: torch.Tensor, gs: float, fp4, sf, layout, max_blocks: int = 48, recipe: str = "fast"):
    m, k = x.shape
    codes, sfs = unpack_codes(fp4), gathered_sf(sf, m, k, layout)
    xs, n = x.float(), k // 16
    g = torch.Generator().manual_seed(m * 7919 + k)
    for idx in torch.randperm(m * n, generator=g)[:max_blocks].tolist():
        r, c = divmod(idx, n)
        want_sf, want_codes = quantize_block_scalar(xs[r, 16 * c:16 * c + 16].tolist(), f32(gs), recipe,
                                                    fp8=x.dtype == torch.float8_e4m3fn)
        assert sfs[r, c] == want_sf
        assert codes[r, 16 * c:16 * c + 16].tolist() == want_codes


def _check_round_trip(x: torch.Tensor, gs: float, fp4, sf, layout):
    m, k = x.shape
    xf = x.float()
    deq = dequantize_reference(fp4, sf, gs, layout, m, k)
    scale = e4m3_decode(gathered_sf(sf, m, k, layout)).repeat_interleave(16, 1)  # sf value per element
    gs32 = f32(gs)
    y = xf * gs32 / scale  # element in e2m1 units (approximately x * out_scale)
    ay = y.abs()
    half_step = torch.where(ay < 2, 0.25, torch.where(ay < 4, 0.5, 1.0))
    bound = (half_step + (ay - 6).clamp(min=0)) * scale / gs32
    err = (xf - deq).abs()
    zero_sf = scale == 0
    assert bool((err[~zero_sf] <= bound[~zero_sf] * (1 + 1e-5) + 1e-6 * xf.abs()[~zero_sf] + 1e-37).all())
    # blocks whose scale rounds to 0 come back as 0, and were below half the smallest e4m3 step
    assert not deq[zero_sf].any()
    assert bool((xf.abs()[zero_sf] <= 6 * 2.0**-10 / gs32 * 1.001).all())


@pytest.mark.parametrize("recipe", ["fast", "exact"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [1, 3, 127, 129])
@pytest.mark.parametrize("k", [16, 48, 2048])
def test_shapes_layouts_dtypes(dtype, layout, m, k, recipe):
    x = _data(m, k, seed=m + k).to(dtype)
    gs = 448.0 * 6.0 / float(x.float().abs().max())
    fp4, sf = quantize_reference(x, gs, layout, recipe)
    assert fp4.shape == (m, k // 2) and fp4.dtype == torch.uint8
    assert sf.shape == padded_sf_shape(m, k // 16, layout) and sf.dtype == torch.uint8
    _check_against_scalar(x, gs, fp4, sf, layout, recipe=recipe)
    if dtype == torch.float8_e4m3fn:  # FlashInfer's fp8 path: the data dequantize to x * 6 / gs
        _check_round_trip((x.float() * f32(6.0 * f32(1.0 / gs))).half(), gs, fp4, sf, layout)
    else:
        _check_round_trip(x, gs, fp4, sf, layout)


@pytest.mark.parametrize("gs", [1.0, 1e-3, 7.5, 1e4])
def test_round_trip_various_global_scales(gs):
    x = _data(64, 256, seed=5).to(torch.float16)
    fp4, sf = quantize_reference(x, gs)
    _check_round_trip(x, gs, fp4, sf, SfLayout.layout_128x4)
    _check_against_scalar(x, gs, fp4, sf, SfLayout.layout_128x4, max_blocks=64)


def test_input_dtypes_agree_with_their_fp32_values():
    x = _data(16, 64, seed=3)
    for dtype in (torch.float16, torch.bfloat16):  # fp8 input is pre-scaled first (FlashInfer's fp8 path)
        xd = x.to(dtype)
        a = quantize_reference(xd, 3.0, "8x4")
        b = quantize_reference(xd.float(), 3.0, "8x4")
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_higher_rank_input_is_flattened():
    x = _data(12, 32, seed=4).half()
    a = quantize_reference(x.view(2, 3, 2, 32), 2.0)
    b = quantize_reference(x, 2.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    fp4, sf = quantize_reference(torch.zeros(0, 32, dtype=torch.float16), 1.0)
    assert fp4.shape == (0, 16) and sf.shape == (0, 4)


def test_layouts_hold_the_same_scales():
    x = _data(129, 96, seed=6).bfloat16()
    results = [quantize_reference(x, 1.5, lay) for lay in LAYOUTS]
    for (fp4, sf), lay in zip(results, LAYOUTS):
        assert torch.equal(fp4, results[0][0])
        assert torch.equal(gathered_sf(sf, 129, 96, lay), gathered_sf(results[0][1], 129, 96, 0))


def test_global_sf_tensor_and_float_agree():
    x = _data(4, 32, seed=7).half()
    a = quantize_reference(x, torch.tensor([0.3]))
    b = quantize_reference(x, 0.3)
    c = quantize_reference(x, torch.tensor(0.3, dtype=torch.float64))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


def test_dequantize_by_hand():
    fp4 = torch.tensor([[0x7A] + [0] * 7], dtype=torch.uint8)  # codes: 0xA (-1.0), 0x7 (6.0)
    sf = torch.zeros(1, 1, dtype=torch.uint8)
    sf[0, 0] = 0x40  # e4m3 2.0
    out = dequantize_reference(fp4, sf, 4.0, "linear", 1, 16)
    assert out.dtype == torch.float32 and out.shape == (1, 16)
    assert out[0, :2].tolist() == [-0.5, 3.0] and not out[0, 2:].any()
    # a flat or float8-typed sf buffer is accepted too
    out2 = dequantize_reference(fp4, sf.view(-1).view(torch.float8_e4m3fn), 4.0, 2, 1, 16)
    assert torch.equal(out, out2)
    # the division by gs is one fp32 division (not a multiply by f32(1/gs)): 1.5 * 3.0 / 5
    fp4[0, 0], sf[0, 0] = 0xB3, 0x44  # codes 3 (1.5) and 0xB (-1.5); e4m3 3.0
    out = dequantize_reference(fp4, sf, 5.0, "linear", 1, 16)
    assert out[0, :2].tolist() == [f32(4.5 / 5), -f32(4.5 / 5)] == [0.8999999761581421, -0.8999999761581421]


@settings(max_examples=150 if FULL_TIER else 40, deadline=None, database=None)
@given(
    bits=st.lists(st.integers(0, 0xFFFF).filter(lambda b: (b >> 10) & 0x1F != 0x1F), min_size=32, max_size=32),
    base=st.integers(-14, 15),
    small=st.lists(st.integers(-24, 24), min_size=32, max_size=32),
    gs=st.one_of(st.floats(1e-3, 1e4), st.sampled_from([1.0, 2.0, 0.5, 448.0 * 6.0])),
    mode=st.booleans(),
)
def test_matches_scalar_oracle_property(bits, base, small, gs, mode):
    if mode:  # arbitrary finite fp16 bit patterns: huge in-block dynamic range
        x = torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.float16)
    else:  # small multiples of a power of two: hits the e2m1 ties often
        x = (torch.tensor(small, dtype=torch.float32) * 2.0**base / 4).to(torch.float16)
    x = x.view(1, 32)
    fp4, sf = quantize_reference(x, gs, "linear")
    _check_against_scalar(x, gs, fp4, sf, "linear", max_blocks=2)


def test_large_input_is_fast_enough():
    x = torch.randn(4096, 4096, dtype=torch.bfloat16)  # 2^24 elements
    t0 = time.perf_counter()
    fp4, sf = quantize_reference(x, 448.0 * 6.0 / float(x.float().abs().max()))
    elapsed = time.perf_counter() - t0
    assert fp4.shape == (4096, 2048) and sf.shape == (4096, 256)
    assert elapsed < 30.0, f"quantize_reference took {elapsed:.1f}s for 2^24 elements"


# ----------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("shape", [(4, 8), (2, 24), (3, 17), (1, 0), (16,)])
def test_bad_k_or_rank_names_a(shape):
    with pytest.raises(ValueError, match=r"^a: "):
        quantize_reference(torch.ones(shape, dtype=torch.float16), 1.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"^a: .*int32"):
        quantize_reference(torch.ones(1, 16, dtype=torch.int32), 1.0)
    with pytest.raises(TypeError, match=r"^a: "):
        quantize_reference([[1.0] * 16], 1.0)
    x = torch.ones(1, 16, dtype=torch.float16)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e39, torch.ones(2)):
        with pytest.raises(ValueError, match=r"^global_sf: "):
            quantize_reference(x, bad)
    with pytest.raises(TypeError, match=r"^global_sf: "):
        quantize_reference(x, "1.0")


def test_bad_dequantize_arguments():
    fp4, sf = quantize_reference(torch.ones(2, 32, dtype=torch.float16), 1.0)
    with pytest.raises(ValueError, match=r"^k: "):
        dequantize_reference(fp4, sf, 1.0, 0, 2, 24)
    with pytest.raises(ValueError, match=r"^fp4: "):
        dequantize_reference(fp4[:1], sf, 1.0, 0, 2, 32)
    with pytest.raises(ValueError, match=r"^sf: "):
        dequantize_reference(fp4, sf[:64], 1.0, 0, 2, 32)
    with pytest.raises(ValueError, match=r"^sf: "):
        dequantize_reference(fp4, sf.float(), 1.0, 0, 2, 32)
    with pytest.raises(ValueError, match="sfLayout"):
        dequantize_reference(fp4, sf, 1.0, "bogus", 2, 32)
    with pytest.raises(ValueError, match=r"^m: "):
        dequantize_reference(fp4, sf, 1.0, 0, -2, 32)
    with pytest.raises(TypeError, match=r"^m: "):
        sf_offsets(1.5, 2)


@pytest.mark.parametrize("init", ["random", "boundary", "zeros", "maxes", "spread"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_exact_recipe_equals_the_transformer_engine_formula(dtype, init):
    """quantize_reference(recipe="exact") against the TE formula written independently (te_nvfp4.py), on
    FlashInfer's TE-test data kinds and a log-spread of block maxima."""
    from te_nvfp4 import te_quantize

    g = torch.Generator().manual_seed(1)
    M, K = 64, 256
    if init == "random":
        x = torch.randn(M, K, generator=g)
        x[0] = 0
    elif init == "boundary":
        x = torch.linspace(-12, 12, K).repeat(M, 1) + (torch.rand(M, K, generator=g) * 2e-3 - 1e-3)
    elif init == "zeros":
        x = torch.zeros(M, K)
    elif init == "maxes":
        x = torch.full((M, K), torch.finfo(dtype).max)
    else:
        x = torch.randn(M, K // 16, 16, generator=g) * torch.exp2(torch.randint(-20, 12, (M, K // 16, 1),
                                                                                 generator=g).float())
        x = x.view(M, K)
    x = x.to(dtype)
    amax = x.float().abs().max()
    gs = torch.clamp(448.0 * 6.0 / amax, max=torch.finfo(torch.float32).max)
    gs = torch.where(gs == 0, torch.ones_like(gs), gs)
    for layout in LAYOUTS:
        got = quantize_reference(x, gs, layout, "exact")
        want = te_quantize(x, gs, layout)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (init, layout)


# ----------------------------------------------------------------------------------------------
# FlashInfer's per-token scales and 4over6 search: scalar oracles from the formulas (docs/design.md 5.6, 5.7)


def e2m1_value_scalar(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1_POS[code & 7]


def four_over_six_block_scalar(block, gs, ra, recipe, mode, fp16, e4m3_max) -> tuple[int, list[int]]:
    """One block's 4over6 choice: candidate scales amax -> 6 and amax -> 4, each with its codes and its error summed
    in element order (one float32 rounding per operation); the 4 one only if its error is smaller."""
    amax = max(abs(v) for v in block)
    if amax == 0:
        return 0, [0] * 16
    sf6 = f32(f32(amax / 6.0) * gs) if recipe == "exact" else f32(gs * f32(amax * f32(1.0 / 6.0)))
    gds = f32(1.0 / gs)
    cands = []
    for hp in (f32(sf6 * 1.5), sf6):
        code = nearest_even_code(E4M3_POS, min(hp, 448.0))
        s = E4M3_POS[code]
        if recipe == "exact":
            os = FLT_MAX if s == 0 else min(f32(1.0 / f32(s * gds)), FLT_MAX)
        else:
            os = 0.0 if s == 0 else f32(1.0 / f32(s * gds))
        codes = [e2m1_code_scalar(f32(v * os), math.copysign(1.0, v) < 0) for v in block]
        err = 0.0
        for v, c in zip(block, codes):
            val = e2m1_value_scalar(c) * s  # exact
            if fp16:
                d = f32(val - f32(v * gs))
            else:
                d = f32((f32(f32(val * ra) / (6.0 * e4m3_max)) if ra > 0 else f32(val * gds)) - v)
            err = f32(err + (abs(d) if mode == "mae" else f32(d * d)))
        cands.append((err, code, codes))
    (e4, c4, q4), (e6, c6, q6) = cands
    return (c4, q4) if e4 < e6 else (c6, q6)


def row_scale_scalar(row, gsi, recipe, four6) -> tuple[float, float, float]:
    """Per-token mode: (row amax, encode scale, per-token scale) of one row."""
    ra = max([abs(v) for v in row if not math.isnan(v)] + [0.0])
    ftz = lambda v: 0.0 if abs(v) < 2.0**-126 else v  # noqa: E731  (FlashInfer's kernels flush subnormals)
    if recipe == "exact":
        gsc = f32(1.0 / gsi)
        if four6:
            e = 0.0 if ra == 0 else (min(f32(gsc / ra), FLT_MAX) or 1.0)
            return ra, e, 0.0 if e == 0 else ftz(f32(1.0 / e))
        e = (FLT_MAX if ra == 0 else min(f32(gsc / ra), FLT_MAX)) or 1.0
        return ra, e, ftz(f32(1.0 / e))
    pts = f32(ra * gsi)
    return ra, (f32(1.0 / pts) if pts else 0.0), pts


def _per_token_input(dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 8, 16, generator=g) * torch.exp2(torch.randint(-6, 7, (7, 8, 1), generator=g).float())
    x[0] = 0.0                           # a zero row
    x[1, 2] = 0.0                        # a zero block
    x[2, 3] = torch.tensor([3.0, 1.5, -0.75, 0.25] * 4)  # ties of the e2m1 grid
    x[3] *= 2.0**-20                     # a tiny row
    x[4, 5, 0] = 2.0**10                 # a spike: the rest of its block rounds to 0 in one candidate
    return x.reshape(7, 128).to(dtype)


FOUR6_CASES = [None, ("mae", False, 448), ("mse", False, 448), ("mae", True, 448), ("mse", True, 256), ("mae", False, 256)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("recipe", ["fast", "exact"])
@pytest.mark.parametrize("four6", FOUR6_CASES)
@pytest.mark.parametrize("per_token", [False, True])
def test_per_token_and_four_over_six_match_the_scalar_oracle(dtype, recipe, four6, per_token):
    from gdnjit.reference.nvfp4 import FourOverSix

    x = _per_token_input(dtype, seed=int(per_token) + 2 * FOUR6_CASES.index(four6))
    cfg = None if four6 is None else FourOverSix(*four6)
    e4m3_max = 448 if cfg is None else cfg.e4m3_max
    gsi = f32(1.0 / (e4m3_max * 6.0))
    gs_tensor = f32(e4m3_max * 6.0 / float(x.float().abs().max()))
    got = quantize_reference(x, gsi if per_token else gs_tensor, SfLayout.layout_linear, recipe, per_token=per_token,
                             four_over_six=cfg)
    codes, sf = unpack_codes(got[0]), gathered_sf(got[1], 7, 128, SfLayout.layout_linear)
    for r in range(7):
        row = [float(v) for v in x[r].float()]
        if per_token:
            ra, gs, pts = row_scale_scalar(row, gsi, recipe, cfg is not None)
            assert float(got[2][r]) == pts, (r, float(got[2][r]), pts)
        else:
            ra, gs = 0.0, gs_tensor
        for b in range(8):
            block = row[16 * b:16 * b + 16]
            if cfg is not None:
                want_sf, want = four_over_six_block_scalar(block, gs, ra, recipe, cfg.err_mode, cfg.err_fp16, e4m3_max)
            elif gs == 0:  # a zero row's fast per-token scale: every block has scale 0, codes zero with their signs
                want_sf, want = 0, [8 if math.copysign(1.0, v) < 0 else 0 for v in block]
            else:
                want_sf, want = quantize_block_scalar(block, gs, recipe)
            assert int(sf[r, b]) == want_sf, (r, b)
            assert codes[r, 16 * b:16 * b + 16].tolist() == want, (r, b)


def test_four_over_six_picks_the_candidate_with_the_smaller_error():
    """A block that the 4-candidate represents exactly ([4, 2, 1, ...] at amax 4: scale 1 fits 4 = code 6) picks
    scale 4 / 4 = 1 where the 6-candidate (scale 4 / 6 -> 0.6875) cannot; a uniform block on the 6-grid picks 6."""
    from gdnjit.reference.nvfp4 import FourOverSix

    exact4 = torch.tensor([[4.0, 2.0, 1.0, 0.5] * 4])
    fp4, sf = quantize_reference(exact4, 1.0, SfLayout.layout_linear, "exact", four_over_six=FourOverSix())
    assert e4m3_decode(sf.view(-1)[:1]).item() == 1.0  # 4 / 4
    assert unpack_codes(fp4)[0, :4].tolist() == [6, 4, 2, 1]
    grid6 = torch.tensor([[6.0, 3.0, 1.5, 6.0] * 4])
    fp4, sf = quantize_reference(grid6, 1.0, SfLayout.layout_linear, "exact", four_over_six=FourOverSix())
    assert e4m3_decode(sf.view(-1)[:1]).item() == 1.0  # 6 / 6
    assert unpack_codes(fp4)[0, :4].tolist() == [7, 5, 3, 7]


def test_per_token_row_map_and_out_scale():
    from gdnjit.reference.nvfp4 import FourOverSix

    x = _per_token_input(torch.bfloat16, 9)
    full = quantize_reference(x, 1 / 2688, SfLayout.layout_128x4, "exact", per_token=True, four_over_six=FourOverSix())
    row_map = torch.tensor([6, -1, 2, 2, -1, 0, 5, 3, 3], dtype=torch.int32)  # its first 7 entries: rows 0, 2, 5, 6
    got = quantize_reference(x, 1 / 2688, SfLayout.layout_128x4, "exact", per_token=True, four_over_six=FourOverSix(),
                             row_map=row_map, out_scale=torch.tensor([0.5]))
    keep = torch.tensor([r in (0, 2, 5, 6) for r in range(7)])
    assert torch.equal(got[0][keep], full[0][keep]) and not got[0][~keep].any()
    g, f = gathered_sf(got[1], 7, 128, SfLayout.layout_128x4), gathered_sf(full[1], 7, 128, SfLayout.layout_128x4)
    assert torch.equal(g[keep], f[keep]) and not g[~keep].any()
    assert torch.equal(got[2][keep], full[2][keep] * 0.5) and not got[2][~keep].any()
    with pytest.raises(ValueError, match="row_map: expected at least 7 entries"):
        quantize_reference(x, 1 / 2688, per_token=True, row_map=row_map[:6])
    with pytest.raises(IndexError, match="row_map: entry 7 out of range"):
        quantize_reference(x, 1 / 2688, per_token=True, row_map=torch.tensor([7] * 7, dtype=torch.int32))
    with pytest.raises(ValueError, match="row_map, out_scale: only with per_token=True"):
        quantize_reference(x, 1.0, out_scale=2.0)
    with pytest.raises(ValueError, match="per-token scales and 4over6 take float16 / bfloat16"):
        quantize_reference(x.to(torch.float8_e4m3fn), 1.0, four_over_six=FourOverSix())
