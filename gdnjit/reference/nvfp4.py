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


def quantize_reference(a: torch.Tensor, global_sf, layout=SfLayout.layout_128x4, recipe: str = "fast"):
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
    Returns:
        ``(fp4, sf)``: ``fp4`` uint8 ``[M, K // 2]``, element ``2i`` in the low nibble and
        ``2i + 1`` in the high nibble; ``sf`` uint8 ``[padded_rows, padded_cols]`` (see
        :func:`gdnjit.sf_layout.padded_sf_shape`) holding e4m3 bit patterns at
        :func:`gdnjit.sf_layout.sf_offsets`, padding entries 0. Both on ``a``'s device.

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
    fp8 = a.dtype == torch.float8_e4m3fn  # always the fast recipe (FlashInfer's switch does not apply to fp8)
    gs = _global_sf_tensor(global_sf, a.device)
    rgs = torch.reciprocal(gs)

    x = a.detach().reshape(-1, k).to(torch.float32)
    if fp8:  # FlashInfer's pre-scale: fp8 values are taken as x * gs / 6
        x = (x * (rgs * 6.0)).to(torch.float16).to(torch.float32)
    m, n = x.shape[0], k // BLOCK
    blocks = x.view(m, n, BLOCK)

    mag = blocks.abs()
    amax = torch.where(torch.isnan(mag), torch.full_like(mag, -1.0), mag).amax(dim=-1)
    amax = torch.where(amax < 0, torch.full_like(amax, float("nan")), amax)  # all-NaN block

    one_sixth = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=a.device)
    if recipe == "exact" and not fp8:
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

    codes = e2m1_satfinite_rne(blocks * out_scale.unsqueeze(-1)) & 0x7
    codes |= torch.signbit(blocks).to(torch.uint8) << 3  # the sign of x, NaN products included
    pairs = codes.view(m, k // 2, 2)
    fp4 = pairs[..., 0] | (pairs[..., 1] << 4)

    rows, cols = padded_sf_shape(m, n, layout)
    sf = torch.zeros(rows * cols, dtype=torch.uint8, device=a.device)
    sf[sf_offsets(m, n, layout, device=a.device).view(-1)] = sf_bits.view(-1)
    return fp4, sf.view(rows, cols)


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
