"""Exact torch reference for NVFP4 activation quantization (and its inverse).

NVFP4: each 16-element block of a row gets one e4m3 scale factor (SF); elements are stored
as e2m1 (4-bit) codes, two per byte. With a global scale ``gs`` (fp32), per block, all fp32::

    amax      = max |x|                                  (over the block's 16 elements)
    (1/6)     = float32 nearest to 1/6 (0x3E2AAAAB)
    sf        = e4m3_satfinite_rne(gs * (amax * (1/6)))  (amax*(1/6) rounded first, then * gs)
    rgs       = 1 / gs
    out_scale = 0 if sf == 0 else 1 / (float(sf) * rgs)
    q         = e2m1_satfinite_rne(x * out_scale)

Decisions for special values (also in :func:`quantize_reference`'s docstring):

* NaN elements are skipped by ``amax`` (IEEE maxNum, like CUDA ``fmaxf``/``__hmax2``); a block
  whose 16 elements are all NaN gets ``amax = NaN``, SF byte ``0x7F`` (e4m3 NaN).
* ``e2m1_satfinite_rne`` maps NaN to magnitude 6 (code 7), and anything above 6 (Inf
  included) to 6. The code's sign bit is always the sign bit of the *input element*
  (so ``-0.1`` or ``-0.0`` quantized to zero gives ``0x8``, a NaN gives ``0x7``/``0xF``).
  Caveat for kernel comparisons: on a GPU ``NaN * out_scale`` is the canonical (positive) NaN,
  so a kernel may write ``0x7`` where this writes ``0xF``; compare NaN elements by magnitude.
* ``e4m3_satfinite_rne`` clamps to ±448, then uses torch's ``float8_e4m3fn`` conversion, which is
  RNE including subnormals (the tests check it against a bit-level implementation). torch 2.13
  on CPU already saturates overflow to ±448, but older/other conversion paths turned
  ``|x| >= 480`` into NaN, so the clamp keeps the result independent of that. NaN gives ``0x7F``
  (positive, whatever the NaN's sign), like ``cvt.rn.satfinite.e4m3x2.f32``.
* No flush-to-zero anywhere (IEEE fp32 subnormals are kept).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from gdnjit.sf_layout import SfLayout, padded_sf_shape, sf_offsets, to_sf_layout

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitudes of the e2m1 codes 0..7 (bit 3 of a code is the sign)."""
E4M3_MAX = 448.0
"""Largest finite e4m3 (``float8_e4m3fn``) value."""
BLOCK = 16
"""Elements per scale-factor block."""

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float32)


def e4m3_satfinite_rne(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to e4m3 (RNE, saturating to ±448) and return the bit patterns.

    Args:
        x: float32 tensor, any shape.
    Returns:
        uint8 tensor of the same shape: the ``float8_e4m3fn`` bits; NaN gives ``0x7F``.
    """
    bits = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(bits, 0x7F), bits)


def e4m3_decode(bits: torch.Tensor) -> torch.Tensor:
    """Decode e4m3 bit patterns (uint8 tensor, any shape) to exact float32 values (0x7F/0xFF: NaN)."""
    return bits.view(torch.float8_e4m3fn).to(torch.float32)


def e2m1_satfinite_rne(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to e2m1 codes, round-to-nearest-even, saturating to ±6.

    Ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    Magnitudes above 6 (Inf included) and NaN give magnitude 6. The sign bit (bit 3) is the
    sign bit of ``x`` (so ``-0.0`` and small negatives give ``0x8``).

    Args:
        x: float32 tensor, any shape.
    Returns:
        uint8 tensor of the same shape holding codes 0..15.
    """
    y = x.abs()
    # Number of e2m1 midpoints below y; ">" at a tie rounds down (to the even code below),
    # ">=" rounds up (the code above is even).
    code = (y > 0.25).to(torch.uint8)
    code += y >= 0.75
    code += y > 1.25
    code += y >= 1.75
    code += y > 2.5
    code += y >= 3.5
    code += y > 5.0
    code = torch.where(torch.isnan(y), torch.full_like(code, 7), code)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode e2m1 codes (uint8 tensor of values 0..15, any shape) to float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def _global_sf_tensor(global_sf, device) -> torch.Tensor:
    """``global_sf`` as a 0-dim float32 tensor on ``device``; must be finite and > 0."""
    if isinstance(global_sf, torch.Tensor):
        if global_sf.numel() != 1:
            raise ValueError(
                f"global_sf: expected a float or a one-element tensor, got a tensor of shape "
                f"{tuple(global_sf.shape)}"
            )
        gs = global_sf.detach().reshape(()).to(device=device, dtype=torch.float32)
    elif isinstance(global_sf, (int, float)) and not isinstance(global_sf, bool):
        gs = torch.tensor(float(global_sf), dtype=torch.float32, device=device)
    else:
        raise TypeError(f"global_sf: expected a float or a one-element tensor, got {type(global_sf).__name__}")
    value = float(gs)
    if not (value > 0.0 and value != float("inf")):
        raise ValueError(f"global_sf: expected a finite value > 0 (as float32), got {value!r}")
    return gs


def _check_k(k, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0 or k % BLOCK:
        raise ValueError(f"{name}: expected a positive multiple of {BLOCK}, got {k!r}")
    return k


RECIPES = ("fast", "exact")
"""FlashInfer's two NVFP4 recipes (see :func:`quantize_reference`)."""

FLT_MAX = 3.4028234663852886e38
FLT_MIN = 1.1754943508222875e-38  # smallest normal float32


class FourOverSix(NamedTuple):
    """FlashInfer's "4over6" block-scale search (see :func:`quantize_reference`): each block is quantized with
    the scale mapping its amax to 6 and to 4, and keeps the candidate with the smaller error.

    ``err_mode``: ``"mae"`` (sum of |error|) or ``"mse"`` (sum of error^2); ``err_fp16``: the error of the
    candidates' scaled values (FlashInfer's ``err_use_fast_math``) instead of their dequantized values;
    ``e4m3_max``: 448 or 256, the bound the per-token global scale was built for (``1 / (e4m3_max * 6)``),
    which enters the per-token error as ``6 * e4m3_max``."""

    err_mode: str = "mae"
    err_fp16: bool = False
    e4m3_max: int = 448

    @property
    def param(self) -> str:
        """The ``four_over_six`` value of the nvfp4_quantize spec: ``mae``, ``mse``, ``mae_fp16``, ``mse_fp16``."""
        return self.err_mode + ("_fp16" if self.err_fp16 else "")


def _check_four_over_six(four_over_six) -> Optional[FourOverSix]:
    if four_over_six is None:
        return None
    if not isinstance(four_over_six, FourOverSix):
        raise TypeError(f"four_over_six: expected None or a FourOverSix, got {type(four_over_six).__name__}")
    if four_over_six.err_mode not in ("mae", "mse") or not isinstance(four_over_six.err_fp16, bool) or \
            four_over_six.e4m3_max not in (256, 448):
        raise ValueError(f"four_over_six: expected err_mode 'mae' / 'mse', a bool err_fp16 and e4m3_max 256 / 448, "
                         f"got {four_over_six!r}")
    return four_over_six


def _flush_subnormal(v: torch.Tensor) -> torch.Tensor:
    """FlashInfer's kernels flush subnormal fp32 results to zero (they build with -use_fast_math): used where a
    per-token scale of a zero row would otherwise be 1 / FLT_MAX."""
    return torch.where(v.abs() < FLT_MIN, torch.zeros_like(v), v)


def _row_scales(x: torch.Tensor, gsi: torch.Tensor, recipe: str, four6: bool):
    """Per-token mode: (row amax, the rows' encode scales, the per-token (decode) scales), all ``[M]`` float32.
    ``gsi`` is the inverse base scale ``1 / (e4m3_max * 6)`` (FlashInfer's ``a_global_sf`` in this mode)."""
    mag = x.abs()
    ra = torch.where(torch.isnan(mag), torch.zeros_like(mag), mag).amax(dim=-1)  # NaN skipped, 0 if all NaN
    zero = torch.zeros_like(ra)
    if recipe == "exact":
        gsc = torch.reciprocal(gsi)
        enc = torch.fmin(gsc / ra, torch.full_like(ra, FLT_MAX))
        if four6:  # a zero row: encode scale 0, per-token scale 0
            enc = torch.where(ra != 0, torch.where(enc == 0, torch.ones_like(enc), enc), zero)
            pts = torch.where(enc != 0, _flush_subnormal(torch.reciprocal(enc)), zero)
        else:  # a zero row: encode scale FLT_MAX, per-token scale 1 / FLT_MAX flushed to 0
            enc = torch.where(ra != 0, enc, torch.full_like(ra, FLT_MAX))
            enc = torch.where(enc == 0, torch.ones_like(enc), enc)
            pts = _flush_subnormal(torch.reciprocal(enc))
    else:
        pts = ra * gsi
        enc = torch.where(pts != 0, torch.reciprocal(pts), zero)
    return ra, enc, pts


def _four_over_six_blocks(blocks, amax, gs, ra, recipe: str, cfg: FourOverSix):
    """(sf bits [M, n], codes [M, n, 16]) of the 4over6 search (see :func:`quantize_reference`). ``gs``, ``ra``:
    the encode scale and the row amax (0 in per-tensor mode), broadcastable to ``[M, n]``."""
    one_sixth = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=blocks.device)
    flt_max = torch.tensor(FLT_MAX, dtype=torch.float32, device=blocks.device)
    # divisions by a device tensor: torch turns a division by a Python number into a multiplication by its reciprocal
    # on the GPU (not correctly rounded)
    six = torch.tensor(6.0, dtype=torch.float32, device=blocks.device)
    denom = torch.tensor(6.0 * cfg.e4m3_max, dtype=torch.float32, device=blocks.device)
    if recipe == "exact":
        sf6 = (amax / six) * gs
    else:
        sf6 = gs * (amax * one_sixth)
    sf4 = sf6 * 1.5
    gds = torch.reciprocal(gs)
    signs = torch.signbit(blocks).to(torch.uint8) << 3
    errs, cands = [], []
    for hp in (sf4, sf6):
        bits = e4m3_satfinite_rne(hp)
        s = e4m3_decode(bits)
        if recipe == "exact":
            os = torch.fmin(torch.reciprocal(s * gds), flt_max)
        else:
            os = torch.where(s == 0, torch.zeros_like(s), torch.reciprocal(s * gds))
        codes = (e2m1_satfinite_rne(blocks * os.unsqueeze(-1)) & 0x7) | signs
        vals = e2m1_decode(codes) * s.unsqueeze(-1)  # exact: an e2m1 value times an e4m3 one
        if cfg.err_fp16:
            diff = vals - blocks * gs.unsqueeze(-1)
        else:
            dq = torch.where(ra.unsqueeze(-1) > 0, (vals * ra.unsqueeze(-1)) / denom, vals * gds.unsqueeze(-1))
            diff = dq - blocks
        term = diff.abs() if cfg.err_mode == "mae" else diff * diff
        err = torch.zeros_like(amax)
        for i in range(BLOCK):  # in element order, one rounding per addition
            err = err + term[..., i]
        errs.append(err)
        cands.append((bits, codes))
    pick4 = errs[0] < errs[1]
    zero = amax == 0
    sf_bits = torch.where(zero, torch.zeros_like(cands[0][0]), torch.where(pick4, cands[0][0], cands[1][0]))
    codes = torch.where(zero.unsqueeze(-1), torch.zeros_like(cands[0][1]),
                        torch.where(pick4.unsqueeze(-1), cands[0][1], cands[1][1]))
    return sf_bits, codes


def quantize_reference(a: torch.Tensor, global_sf, layout=SfLayout.layout_128x4, recipe: str = "fast", *,
                       per_token: bool = False, four_over_six: Optional[FourOverSix] = None,
                       row_map: Optional[torch.Tensor] = None, out_scale=None):
    """Quantize activations to NVFP4 exactly as the kernels must (see the module docstring).

    Args:
        a: ``[M, K]`` tensor (more dims are flattened to ``[numel // K, K]``), dtype float16,
            bfloat16 or float8_e4m3fn (float32 is accepted too, as a testing convenience);
            ``K`` a positive multiple of 16.
        global_sf: the global scale ``gs``: a Python number or a one-element tensor; rounded to
            float32, which must be finite and > 0.
        layout: SF layout (:class:`SfLayout`, its int value or its name).
        recipe: ``"fast"`` (FlashInfer's default): ``sf = e4m3(gs * (amax * (1/6)))``, ``out_scale = 0 if
            sf == 0 else 1 / (sf * (1 / gs))``; ``"exact"`` (FlashInfer's ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1``,
            TransformerEngine's reference): ``sf = e4m3(amax * (gs * (1/6)))``, ``out_scale = min(1 / (sf * (1 / gs)),
            FLT_MAX)`` (NaN: FLT_MAX). float8_e4m3fn input is quantized as FlashInfer does, whatever ``recipe``: each element
            is first pre-scaled, ``x = fp16_rne(x * (6 * (1 / gs)))``, and ``out_scale = 0 if gs * (amax * (1/6)) == 0
            else gs * (1 / sf)`` (so dequantizing gives back ``x_fp8 * 6 / gs``).
        per_token: FlashInfer's per-token activation scales: ``global_sf`` is then the inverse base scale
            ``gsi = 1 / (e4m3_max * 6)``, and each row r gets its own encode scale from its amax ``ra`` (NaN
            skipped, 0 for an all-NaN row): exact recipe ``e = min((1 / gsi) / ra, FLT_MAX)`` (``e = 1`` where that
            is 0; a zero row: ``e = FLT_MAX``, or ``e = 0`` with 4over6) and per-token scale ``1 / e`` (0 for
            ``e = 0``; subnormal results flushed to 0, as FlashInfer's kernels do); fast recipe per-token scale
            ``ra * gsi`` and ``e = 1 / that`` (0 for 0). The blocks of row r are quantized with ``gs = e``.
            fp16 / bf16 input only.
        four_over_six: a :class:`FourOverSix` (None: off): per block with ``amax != 0`` two candidate scales,
            ``sf6 = (amax / 6) * gs`` (exact recipe; fast: ``gs * (amax * (1/6))``) and ``sf4 = sf6 * 1.5``, each
            rounded to e4m3 (``s``) and used as above: exact ``out_scale = min(1 / (s * (1 / gs)), FLT_MAX)``, fast
            ``0 if s == 0 else 1 / (s * (1 / gs))``. Each candidate's error is summed over the 16 elements in order
            (one rounding per operation): ``d = q * s * ra / (6 * e4m3_max) - x`` in per-token mode, ``d = q * s *
            (1 / gs) - x`` per tensor (``q`` the code's value, ``q * s`` exact), or with ``err_fp16`` ``d = q * s - x
            * gs``; the term is ``|d|`` (``mae``) or ``d * d`` (``mse``). The 4 candidate wins only if its error is
            smaller. A block with ``amax == 0`` gets scale byte 0 and codes 0 (no sign bits). fp16 / bf16 input only.
        row_map: per-token mode only (FlashInfer's ``expanded_idx_to_permuted_idx``): int32 ``[R >= M]``; row
            ``row_map[i]`` is quantized for each ``i < M`` (negative entries skip), all other rows' outputs stay 0.
        out_scale: per-token mode only: a scalar (number or one-element tensor) the returned per-token scales are
            multiplied by (FlashInfer's ``out_scale``; the codes and block scales do not change).
    Returns:
        ``(fp4, sf)``: ``fp4`` uint8 ``[M, K // 2]``, element ``2i`` in the low nibble and
        ``2i + 1`` in the high nibble; ``sf`` uint8 ``[padded_rows, padded_cols]`` (see
        :func:`gdnjit.sf_layout.padded_sf_shape`) holding e4m3 bit patterns at
        :func:`gdnjit.sf_layout.sf_offsets`, padding entries 0. Both on ``a``'s device. Per-token mode:
        ``(fp4, sf, per_token_scale)`` with float32 ``[M]`` scales.

    Special values: NaN elements are ignored by the block amax unless all 16 are NaN (then the
    SF byte is 0x7F and every code is ±6); NaN elements encode as ±6 and Inf as ±6, each
    code's sign is the input element's sign bit; a block whose scale rounds to 0 gets
    out_scale 0, so its codes are 0x0/0x8.

    Raises:
        TypeError: ``a`` is not a tensor, ``global_sf`` is not a number/tensor.
        ValueError: naming ``a`` (dtype, fewer than 2 dims, K not a positive multiple of 16),
            ``global_sf`` (not one element, not finite and > 0) or ``sfLayout``.
    """
    layout = to_sf_layout(layout)
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a: expected a torch.Tensor, got {type(a).__name__}")
    if a.dtype not in _INPUT_DTYPES:
        raise ValueError(f"a: expected dtype float16, bfloat16, float8_e4m3fn (or float32), got {a.dtype}")
    if a.dim() < 2:
        raise ValueError(f"a: expected at least 2 dims [M, K], got shape {tuple(a.shape)}")
    k = a.shape[-1]
    if k <= 0 or k % BLOCK:
        raise ValueError(f"a: expected the last dim K to be a positive multiple of {BLOCK}, got K={k}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe: expected one of {list(RECIPES)}, got {recipe!r}")
    four6 = _check_four_over_six(four_over_six)
    fp8 = a.dtype == torch.float8_e4m3fn  # always the fast recipe (FlashInfer's switch does not apply to fp8)
    if fp8 and (per_token or four6 is not None):
        raise ValueError("a: per-token scales and 4over6 take float16 / bfloat16 input, got float8_e4m3fn")
    if not per_token and (row_map is not None or out_scale is not None):
        raise ValueError("row_map, out_scale: only with per_token=True")
    gs = _global_sf_tensor(global_sf, a.device)
    rgs = torch.reciprocal(gs)
    pts_mult = None if out_scale is None else _scalar_tensor(out_scale, a.device, "out_scale")

    x = a.detach().reshape(-1, k).to(torch.float32)
    if fp8:  # FlashInfer's pre-scale: fp8 values are taken as x * gs / 6
        x = (x * (rgs * 6.0)).to(torch.float16).to(torch.float32)
    m, n = x.shape[0], k // BLOCK
    blocks = x.view(m, n, BLOCK)
    ra = torch.zeros((), dtype=torch.float32, device=a.device)
    if per_token:  # gs was the inverse base scale: each row's own encode scale replaces it
        ra, enc, pts = _row_scales(x, gs, recipe, four6 is not None)
        ra, gs = ra.view(m, 1), enc.view(m, 1)
        rgs = torch.reciprocal(gs)

    mag = blocks.abs()
    amax = torch.where(torch.isnan(mag), torch.full_like(mag, -1.0), mag).amax(dim=-1)
    amax = torch.where(amax < 0, torch.full_like(amax, float("nan")), amax)  # all-NaN block

    one_sixth = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=a.device)
    if four6 is not None:
        sf_bits, codes = _four_over_six_blocks(blocks, amax, gs, ra, recipe, four6)
    elif recipe == "exact" and not fp8:
        sf_bits = e4m3_satfinite_rne(amax * (gs * one_sixth))
        sf_val = e4m3_decode(sf_bits)
        out_scale = torch.fmin(torch.reciprocal(sf_val * rgs), torch.tensor(torch.finfo(torch.float32).max,
                                                                             device=a.device))
    elif fp8:
        sf_unrounded = gs * (amax * one_sixth)
        sf_bits = e4m3_satfinite_rne(sf_unrounded)
        sf_val = e4m3_decode(sf_bits)
        out_scale = torch.where(sf_unrounded == 0, torch.zeros_like(sf_val), gs * torch.reciprocal(sf_val))
    else:
        sf_bits = e4m3_satfinite_rne(gs * (amax * one_sixth))
        sf_val = e4m3_decode(sf_bits)
        out_scale = torch.where(sf_val == 0, torch.zeros_like(sf_val), torch.reciprocal(sf_val * rgs))

    if four6 is None:
        codes = e2m1_satfinite_rne(blocks * out_scale.unsqueeze(-1)) & 0x7
        codes |= torch.signbit(blocks).to(torch.uint8) << 3  # the sign of x, NaN products included
    pairs = codes.view(m, k // 2, 2)
    fp4 = pairs[..., 0] | (pairs[..., 1] << 4)

    if per_token:
        if pts_mult is not None:
            pts = pts * pts_mult
        if row_map is not None:  # only the mapped rows are written
            keep = torch.zeros(m, dtype=torch.bool, device=a.device)
            keep[_mapped_rows(row_map, m, a.device)] = True
            fp4 = torch.where(keep.view(m, 1), fp4, torch.zeros_like(fp4))
            sf_bits = torch.where(keep.view(m, 1), sf_bits, torch.zeros_like(sf_bits))
            pts = torch.where(keep, pts, torch.zeros_like(pts))
    rows, cols = padded_sf_shape(m, n, layout)
    sf = torch.zeros(rows * cols, dtype=torch.uint8, device=a.device)
    sf[sf_offsets(m, n, layout, device=a.device).view(-1)] = sf_bits.view(-1)
    if per_token:
        return fp4, sf.view(rows, cols), pts
    return fp4, sf.view(rows, cols)


def _scalar_tensor(v, device, name: str) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{name}: expected a scalar (one element), got shape {tuple(v.shape)}")
        return v.detach().reshape(()).to(device=device, dtype=torch.float32)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name}: expected a number or a one-element tensor, got {type(v).__name__}")
    return torch.tensor(float(v), dtype=torch.float32, device=device)


def _mapped_rows(row_map: torch.Tensor, m: int, device) -> torch.Tensor:
    """The rows a ``row_map`` selects (its non-negative entries), checked to be below ``m``."""
    if not isinstance(row_map, torch.Tensor) or row_map.dim() != 1 or row_map.dtype != torch.int32:
        raise ValueError("row_map: expected a 1-D int32 tensor")
    if row_map.numel() < m:
        raise ValueError(f"row_map: expected at least {m} entries (one per row of a), got {row_map.numel()}")
    rows = row_map[:m].to(device=device, dtype=torch.int64)
    rows = rows[rows >= 0]
    if rows.numel() and int(rows.max()) >= m:
        raise IndexError(f"row_map: entry {int(rows.max())} out of range for {m} rows")
    return rows


def dequantize_reference(fp4: torch.Tensor, sf: torch.Tensor, global_sf, layout, m: int, k: int) -> torch.Tensor:
    """Expand NVFP4 data back to float32: ``e2m1(code) * float(e4m3(sf)) / gs`` (fp32).

    Args:
        fp4: uint8 tensor with ``m * k // 2`` elements (normally ``[m, k // 2]``), packed as
            :func:`quantize_reference` returns it.
        sf: uint8 (or float8_e4m3fn) tensor with ``padded_rows * padded_cols`` elements, in
            ``layout``.
        global_sf: the global scale used to quantize (number or one-element tensor).
        layout: SF layout (:class:`SfLayout`, its int value or its name).
        m: number of rows (>= 0). k: row length, a positive multiple of 16.
    Returns:
        float32 ``[m, k]`` on ``fp4``'s device (an SF byte 0x7F/0xFF decodes to NaN).

    Raises:
        TypeError / ValueError: naming ``fp4``, ``sf``, ``global_sf``, ``sfLayout``, ``m`` or ``k``.
    """
    layout = to_sf_layout(layout)
    k = _check_k(k, "k")
    rows, cols = padded_sf_shape(m, k // BLOCK, layout)
    for name, t, numel, dtypes in (
        ("fp4", fp4, m * k // 2, (torch.uint8,)),
        ("sf", sf, rows * cols, (torch.uint8, torch.float8_e4m3fn)),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes or t.numel() != numel:
            raise ValueError(
                f"{name}: expected {numel} elements of dtype {' or '.join(map(str, dtypes))}, "
                f"got shape {tuple(t.shape)} dtype {t.dtype}"
            )
    gs = _global_sf_tensor(global_sf, fp4.device)
    n = k // BLOCK

    packed = fp4.reshape(m, k // 2)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(m, n, BLOCK)
    sf_flat = sf.reshape(-1).view(torch.uint8).to(fp4.device)
    scales = e4m3_decode(sf_flat[sf_offsets(m, n, layout, device=fp4.device).view(-1)].view(m, n))
    return ((e2m1_decode(codes) * scales.unsqueeze(-1)) / gs).view(m, k)
