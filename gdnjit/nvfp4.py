"""NVFP4 activation quantization with FlashInfer's signature (``nvfp4_quantize``, ``SfLayout``).

This module only validates arguments and builds a named :class:`~gdnjit.runner.KernelCall` of the
``nvfp4_quantize`` spec (``specs/nvfp4_quantize.yaml``); :mod:`gdnjit.runner` dispatches, compiles
and launches it. Results are bit-identical to the package's torch reference
(:func:`gdnjit.reference.nvfp4.quantize_reference`), special values included.

Semantics (docs/design.md section 5), per 16-element block of a row, all fp32::

    amax      = max |x|                                   (NaN elements skipped)
    sf        = e4m3_satfinite_rne(gs * (amax * (1/6)))
    out_scale = 0 if sf == 0 else 1 / (float(sf) * (1 / gs))
    code      = e2m1_satfinite_rne(x * out_scale)         (sign bit = sign of x)

Packing: element ``2i`` in the low nibble of byte ``i``, ``2i + 1`` in the high nibble.
"""

from __future__ import annotations

import enum
import math
import os
import struct
from typing import Optional, Tuple

import torch

from . import validate as _v
from .errors import DtypeError
from .runner import RUNNER, KernelCall, device_info
from .sf_layout import SfLayout, padded_sf_shape, to_sf_layout
from .spec import get_spec

__all__ = ["nvfp4_quantize", "fp4_quantize", "dequantize_nvfp4", "SfLayout", "BACKENDS", "fast_math_from_env"]

SPEC = "nvfp4_quantize"
BACKENDS = ("gdnjit", "cuda", "cute-dsl", "reference")
"""``gdnjit`` (and FlashInfer's spellings ``cuda`` / ``cute-dsl``, whose results FlashInfer keeps identical): the
JIT kernel. ``reference``: the torch reference (slow, synchronises; any device). FlashInfer's ``cake`` (per-token
activation scales) is not provided."""
FAST_MATH_ENV = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
_UNSET = object()
SF_VEC_SIZE = 16
_IN_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4m3"}
_LAYOUT_PARAM = {SfLayout.layout_128x4: "128x4", SfLayout.layout_8x4: "8x4", SfLayout.layout_linear: "linear"}
_MIN_ARCH = 89       # cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2 (Ada, Hopper and newer)
_HW_E2M1_ARCH = 100  # cvt.rn.satfinite.e2m1x2.f32 (sm_100a / sm_103a / sm_110a / sm_120a / sm_121a)
_PDL_ARCH = 90  # griddepcontrol.wait / launch_dependents (sm_90+)
_MAX_SF_BYTES = 2**32 - 2**12  # the kernel's 32-bit scale-byte offsets, with room for the last CTA's threads
_F32 = struct.Struct("f")




def _layout(sfLayout) -> SfLayout:
    """SfLayout, its int / name, or another library's enum member with the same name (FlashInfer's)."""
    if isinstance(sfLayout, enum.Enum) and not isinstance(sfLayout, SfLayout):
        sfLayout = sfLayout.name
    return to_sf_layout(sfLayout)


def fast_math_from_env(environ=None) -> bool:
    """FlashInfer's recipe switch, read per call as FlashInfer does: the fast recipe unless
    ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH`` (or its alias ``TRTLLM_DISABLE_FP4_QUANT_FAST_MATH``) is
    exactly ``"1"``."""
    env = os.environ if environ is None else environ
    return not any(env.get(name) == "1" for name in FAST_MATH_ENV)


def _recipe(fast_math, in_dtype) -> str:
    """``fast_math`` (None: the environment, per call) -> the spec's recipe; fp8 input is always fast."""
    if fast_math is None:
        fast_math = fast_math_from_env()
    elif not isinstance(fast_math, bool):
        raise TypeError(f"fast_math: expected None or a bool, got {type(fast_math).__name__}")
    return "fast" if fast_math or in_dtype == torch.float8_e4m3fn else "exact"


def _global_scale(a_global_sf, device: torch.device):
    """(device pointer or 0, float value, the tensor to keep alive) of the global scale. A tensor of another
    float dtype or device is converted to float32 on ``device`` first (FlashInfer does the same; a copy)."""
    if isinstance(a_global_sf, torch.Tensor):
        if a_global_sf.numel() != 1:
            raise ValueError(
                f"a_global_sf: expected a one-element tensor (or a Python float), got shape {tuple(a_global_sf.shape)}"
            )
        if not a_global_sf.dtype.is_floating_point:
            raise DtypeError(f"a_global_sf: expected a float dtype, got {str(a_global_sf.dtype).replace('torch.', '')}")
        if a_global_sf.device.type == "meta" and device.type != "meta":
            raise ValueError(f"a_global_sf: expected a tensor with a value (on {device}, like a), got a meta tensor")
        if a_global_sf.dtype != torch.float32 or a_global_sf.device != device:
            a_global_sf = a_global_sf.to(device=device, dtype=torch.float32)
        return a_global_sf.data_ptr(), 0.0, a_global_sf
    if isinstance(a_global_sf, bool) or not isinstance(a_global_sf, (int, float)):
        raise TypeError(
            f"a_global_sf: expected a one-element float32 tensor or a Python float, got {type(a_global_sf).__name__}"
        )
    value = float(a_global_sf)
    try:
        f32 = _F32.unpack(_F32.pack(value))[0]  # the value the kernel will see
    except OverflowError:
        f32 = math.inf
    if not (f32 > 0.0 and math.isfinite(f32)):
        raise ValueError(f"a_global_sf: expected a finite value > 0 (as float32), got {value!r}")
    return 0, f32, None


def _check_options(sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend) -> SfLayout:
    layout = _layout(sfLayout)
    if isinstance(sf_vec_size, bool) or not isinstance(sf_vec_size, int):
        raise TypeError(f"sf_vec_size: expected an int, got {type(sf_vec_size).__name__}")
    if sf_vec_size != SF_VEC_SIZE:
        raise ValueError(
            f"sf_vec_size: only {SF_VEC_SIZE} (NVFP4: e4m3 scale per 16 elements) is supported, got {sf_vec_size} "
            f"(32 would be MXFP4, which gdnjit does not implement)"
        )
    if not isinstance(do_shuffle, bool):
        raise TypeError(f"do_shuffle: expected a bool, got {type(do_shuffle).__name__}")
    if do_shuffle:
        raise ValueError(
            "do_shuffle: True is not supported. In FlashInfer it prepares *weights* for its TRT-LLM-gen GEMM "
            "(rows of the packed data and of the scale factors permuted for a 128-row epilogue tile); it is not "
            "an activation layout. Pass do_shuffle=False (activations), and prepare weights with FlashInfer "
            "at load time."
        )
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected None or a bool, got {type(enable_pdl).__name__}")
    if backend == "cake":
        raise NotImplementedError("backend='cake': FlashInfer's Cake NVFP4 backend (per-token activation scales) "
                                  "is not provided by gdnjit")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {list(BACKENDS)}, got {backend!r}")
    return layout


def _check_flashinfer_extras(per_token_activation, expanded_idx_to_permuted_idx, out_scale, nvfp4_4over6) -> None:
    """FlashInfer 0.7.2's further nvfp4_quantize arguments: accepted at their off values; what gdnjit does not
    provide raises NotImplementedError naming it, what FlashInfer itself refuses raises its ValueError."""
    if not isinstance(per_token_activation, bool):
        raise TypeError(f"per_token_activation: expected a bool, got {type(per_token_activation).__name__}")
    if per_token_activation:
        raise NotImplementedError("per_token_activation: FlashInfer's per-token activation scales are not provided "
                                  "by gdnjit (pass False)")
    if expanded_idx_to_permuted_idx is not None:
        raise ValueError("expanded_idx_to_permuted_idx: only with per_token_activation=True (as in FlashInfer)")
    if out_scale is not None:
        raise ValueError("out_scale: only with per_token_activation=True (as in FlashInfer)")
    if nvfp4_4over6 is _UNSET:  # FlashInfer then reads its switch per call: on only when exactly "1"
        if os.environ.get("FLASHINFER_NVFP4_4OVER6") == "1":
            raise NotImplementedError("FLASHINFER_NVFP4_4OVER6=1: FlashInfer's 4over6 recipe is not provided by "
                                      "gdnjit (unset the variable)")
    elif nvfp4_4over6 is not None:
        raise NotImplementedError("nvfp4_4over6: FlashInfer's 4over6 recipe is not provided by gdnjit (pass None)")


def _prepare(a, a_global_sf, sfLayout=SfLayout.layout_128x4, do_shuffle=False, sf_vec_size=16, enable_pdl=None,
             backend="gdnjit", require_cuda: bool = True, arch: Optional[str] = None, recipe: str = "fast"):
    """All argument checks and the output allocation.

    Returns ``(fp4, sf, call)`` where ``call`` is the named :class:`~gdnjit.runner.KernelCall`, or None
    when there is nothing to launch (M == 0). ``require_cuda=False`` (with ``arch``, e.g.
    ``'sm_90'``) lets CPU tests exercise every other check with CPU tensors. ``recipe``: the spec's
    ``fast`` / ``exact`` (:func:`_recipe` turns FlashInfer's switch into it).
    """
    (_v.cuda_tensor if require_cuda else _v.tensor)("a", a)
    if a.dtype not in _IN_DTYPES:
        raise DtypeError(f"a: expected dtype float16, bfloat16 or float8_e4m3fn, got {str(a.dtype).replace('torch.', '')}")
    if a.dim() < 2:
        raise ValueError(f"a: expected at least 2 dims [M, K], got shape {tuple(a.shape)}")
    K = a.shape[-1]
    if K <= 0 or K % SF_VEC_SIZE:
        raise ValueError(f"a: the last dim K must be a positive multiple of {SF_VEC_SIZE}, got K={K}")
    layout = _check_options(sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend)
    spec = get_spec(SPEC)
    if not spec.accepts("K", K):  # K is compile-time: any K of the spec's domain compiles on first use
        raise ValueError(f"a: the last dim K must satisfy {dict(spec.domains)['K']} "
                         f"(gdnjit/specs/nvfp4_quantize.yaml), got K={K}")
    _v.inner_contiguous("a", a)
    try:
        x = a.view(-1, K)
    except RuntimeError:
        raise ValueError(
            f"a: the leading dims of shape {tuple(a.shape)} with strides {a.stride()} cannot be viewed as rows "
            f"[numel / K, K] with one row stride; make it contiguous first"
        ) from None
    M = x.shape[0]
    device = a.device
    _v.aligned("a", x, 16)
    gs_ptr, gs_value, gs_tensor = _global_scale(a_global_sf, device)

    n_blocks = K // SF_VEC_SIZE
    sf_rows, sf_cols = padded_sf_shape(M, n_blocks, layout)
    if sf_rows * sf_cols > _MAX_SF_BYTES:
        raise ValueError(f"a: {M} rows of K={K} are too many for one call (at most 2^32 - 2^12 16-element blocks, "
                         f"padding included); split it")
    fp4 = torch.empty((M, K // 2), dtype=torch.uint8, device=device)
    sf = torch.empty((sf_rows, sf_cols), dtype=torch.uint8, device=device)
    if M == 0:
        return fp4, sf, None

    if require_cuda:
        dev = device.index if device.index is not None else torch.cuda.current_device()
        arch = device_info(dev).arch
    else:
        dev = device.index if device.index is not None else 0
    arch_num = int(arch[3:].rstrip("af"))
    if arch_num < _MIN_ARCH:
        raise ValueError(
            f"a: NVFP4 quantization needs compute capability 8.9 or newer (e4m3 conversions); {device} is {arch}"
        )
    if enable_pdl and arch_num < _PDL_ARCH:
        raise ValueError(f"enable_pdl: True needs compute capability 9.0 or newer (griddepcontrol); {device} is {arch}")
    pdl = (arch_num >= _PDL_ARCH) if enable_pdl is None else enable_pdl  # None: where supported
    # the pdl param picks the variant that waits on griddepcontrol; the call's pdl launches it so
    params = dict(in_dtype=_IN_DTYPES[a.dtype], sf_layout=_LAYOUT_PARAM[layout], K=K, hw_e2m1=arch_num >= _HW_E2M1_ARCH,
                  pdl=pdl, recipe=recipe)
    args = dict(x=x.data_ptr(), q=fp4.data_ptr(), sf=sf.data_ptr(), gs_ptr=gs_ptr, x_stride=x.stride(0), M=M,
                sf_rows=sf_rows, gs_value=gs_value)
    return fp4, sf, KernelCall(spec, params, dict(M=M), args, dev, pdl=pdl)


def nvfp4_quantize(
    a: torch.Tensor,
    a_global_sf,
    sfLayout=SfLayout.layout_128x4,
    do_shuffle: bool = False,
    sf_vec_size: int = 16,
    enable_pdl: Optional[bool] = None,
    backend: str = "gdnjit",
    per_token_activation: bool = False,
    expanded_idx_to_permuted_idx: Optional[torch.Tensor] = None,
    out_scale: Optional[torch.Tensor] = None,
    nvfp4_4over6=_UNSET,
    *,
    fast_math: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations to NVFP4 (e2m1 values, one e4m3 scale per 16 elements, global scale).

    Args:
        a: ``[M, K]`` float16 / bfloat16 / float8_e4m3fn CUDA tensor; more dims are flattened to
            ``[numel // K, K]`` (they must be viewable so). K any multiple of 16 up to 2^20:
            it is a compile-time constant, so a new K compiles once on first use (``gdnjit warm``
            precompiles the K values a shapes file lists).
            The last dim must be contiguous; rows may be strided (the row stride is a kernel
            argument), with the base and the row stride 16-byte aligned. Compute capability >= 8.9.
        a_global_sf: the global scale ``gs``: a one-element float32 tensor on ``a``'s device (read
            by the kernel: no host sync, CUDA-graph safe; it must hold a finite value > 0, not
            checked) or a Python float (finite, > 0; rounded to float32). A tensor of another float
            dtype (bf16 / fp16) or device is converted to float32 on ``a``'s device first, as FlashInfer
            does (a copy per call).
        sfLayout: :class:`SfLayout` (also its int value / name, or FlashInfer's ``SfLayout``
            member): ``layout_128x4`` (default, swizzled for tcgen05 / cuBLASLt GEMMs),
            ``layout_8x4`` or ``layout_linear`` (see :mod:`gdnjit.sf_layout`).
        do_shuffle: must be False. FlashInfer's True permutes rows of a *weight* and its scales for
            its TRT-LLM-gen GEMM (128-row epilogue tiles); that weight-preparation step is not an
            activation layout and is refused with a ValueError.
        sf_vec_size: must be 16 (NVFP4). 32 (MXFP4) raises ValueError.
        enable_pdl: programmatic dependent launch, as in FlashInfer: None (default) = on where the
            device supports it (compute capability >= 9.0), True = on (ValueError below 9.0), False =
            off. On: a kernel variant that waits for the previous kernel in the stream
            (``griddepcontrol.wait``) before touching memory, launched so that it may be scheduled
            while that kernel finishes, and that lets a following PDL kernel start once its loads
            are issued (its own launch shapes: docs/perf.md). Results are identical either way.
        backend: ``"gdnjit"`` or FlashInfer's ``"cuda"`` / ``"cute-dsl"`` (the JIT kernel), or
            ``"reference"`` (the torch reference; slow, synchronises, works on any device). FlashInfer's
            ``"cake"``: NotImplementedError.
        per_token_activation, expanded_idx_to_permuted_idx, out_scale, nvfp4_4over6: FlashInfer 0.7.2's
            per-token scales and 4over6 recipe, not provided: accepted at their off values (False, None,
            None, unset / None); per-token mode, a 4over6 config (or ``FLASHINFER_NVFP4_4OVER6=1``
            enabling it) raise NotImplementedError; the index / out_scale without per-token
            mode raise FlashInfer's ValueError.
        fast_math: the recipe. None (default): FlashInfer's switch, read per call as FlashInfer does:
            fast unless ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH`` (or ``TRTLLM_...``) is ``"1"``. False: the
            exact recipe (TransformerEngine's; docs/design.md section 5). fp8 input is always fast.

    Returns:
        ``(fp4, sf)``: ``fp4`` uint8 ``[M, K // 2]`` (element ``2i`` in the low nibble);
        ``sf`` uint8 ``[padded_rows, padded_cols]`` of e4m3 bit patterns in ``sfLayout``
        (``128x4``: rows padded to 128 and columns to 4; ``8x4``: 8 and 4; ``linear``:
        ``[M, K // 16]``), padding written as 0. FlashInfer returns the same bytes viewed as
        ``(-1, K // 16)``, which is the same shape whenever ``K % 64 == 0``; it returns ``fp4``
        with ``a``'s leading dims, gdnjit flattened to ``[M, K // 2]`` (``fp4.view(*lead, K // 2)``).

    Special values (as the reference): NaN elements are skipped by the block max (an all-NaN block
    gets scale byte 0x7F); NaN and Inf elements encode as magnitude 6; every code's sign bit is
    the input element's sign bit (``-0.0`` and negatives rounding to 0 give ``0x8``).

    Raises:
        TypeError / ValueError naming the argument: wrong types, dtypes, shapes, strides, devices,
        K not a multiple of 16 or above 2^20, unsupported options, unknown backend.
    """
    _check_flashinfer_extras(per_token_activation, expanded_idx_to_permuted_idx, out_scale, nvfp4_4over6)
    recipe = _recipe(fast_math, getattr(a, "dtype", None))
    if backend == "reference" or backend not in BACKENDS:  # options (an unknown backend) before the device
        layout = _check_options(sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend)
        from .reference.nvfp4 import quantize_reference

        return quantize_reference(a, a_global_sf, layout, recipe)
    fp4, sf, call = _prepare(a, a_global_sf, sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend, recipe=recipe)
    if call is not None:
        RUNNER.launch(call)
    return fp4, sf


def fp4_quantize(
    input: torch.Tensor,
    global_scale: Optional[torch.Tensor] = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    is_global_scale_inversed: bool = False,
    enable_pdl: Optional[bool] = None,
    backend: str = "cuda",
    nvfp4_4over6=_UNSET,
    *,
    fast_math: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``fp4_quantize`` (NVFP4 only): :func:`nvfp4_quantize` with its layout flags.

    ``input`` ``[..., K]`` (last dim contiguous); ``global_scale`` the encode scale as in
    :func:`nvfp4_quantize` (required), or its inverse with ``is_global_scale_inversed=True`` (inverted on the
    device, correctly rounded). The scale layout: ``is_sf_swizzled_layout`` False -> linear, else 8x4 with
    ``is_sf_8x4_layout`` and 128x4 without. Returns ``(fp4 [..., K // 2], sf)`` with ``input``'s leading
    dims; ``sf`` as :func:`nvfp4_quantize` returns it. MXFP4 (``sf_vec_size=32`` / ``sf_use_ue8m0=True``) and
    a row-wise global scale (one value per row) are not provided: NotImplementedError; other sizes are
    FlashInfer's NotImplementedError too. ``fast_math`` and the recipe switch as in :func:`nvfp4_quantize`.
    """
    for name, flag in (("sf_use_ue8m0", sf_use_ue8m0), ("is_sf_swizzled_layout", is_sf_swizzled_layout),
                       ("is_sf_8x4_layout", is_sf_8x4_layout), ("is_global_scale_inversed", is_global_scale_inversed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if isinstance(sf_vec_size, bool) or sf_vec_size not in (16, 32):
        raise NotImplementedError(f"sf_vec_size: can only be 16 or 32, got {sf_vec_size!r}")
    if sf_vec_size == 32 or sf_use_ue8m0:
        raise NotImplementedError("sf_vec_size=32 / sf_use_ue8m0=True: MXFP4 is not provided by gdnjit (NVFP4 only)")
    if backend not in ("cuda", "cute-dsl"):
        raise ValueError(f"backend: expected 'cuda' or 'cute-dsl', got {backend!r}")
    if global_scale is None:
        raise ValueError("global_scale: required for NVFP4 (sf_use_ue8m0=False)")
    if isinstance(global_scale, torch.Tensor) and global_scale.numel() != 1:
        rows = input.numel() // input.shape[-1] if isinstance(input, torch.Tensor) and input.dim() else -1
        if global_scale.numel() == rows:
            raise NotImplementedError("global_scale: a row-wise global scale (one value per row) is not provided by "
                                      "gdnjit; pass one value")
    if is_global_scale_inversed:
        if isinstance(global_scale, torch.Tensor):
            global_scale = torch.reciprocal(global_scale.to(torch.float32))
        elif isinstance(global_scale, (int, float)) and not isinstance(global_scale, bool) and global_scale:
            global_scale = 1.0 / float(global_scale)
    layout = SfLayout.layout_linear if not is_sf_swizzled_layout else (
        SfLayout.layout_8x4 if is_sf_8x4_layout else SfLayout.layout_128x4)
    fp4, sf = nvfp4_quantize(input, global_scale, layout, False, 16, enable_pdl, "gdnjit",
                             nvfp4_4over6=nvfp4_4over6, fast_math=fast_math)
    return fp4.view(*input.shape[:-1], input.shape[-1] // 2), sf


def dequantize_nvfp4(
    fp4: torch.Tensor,
    sf: torch.Tensor,
    a_global_sf,
    sfLayout=SfLayout.layout_128x4,
    m: Optional[int] = None,
    k: Optional[int] = None,
) -> torch.Tensor:
    """Expand NVFP4 data back to float32 ``[m, k]``: ``e2m1(code) * float(sf) / gs`` (torch reference).

    ``m`` / ``k`` default to ``fp4.shape[0]`` / ``2 * fp4.shape[1]`` for a 2-D ``fp4``. Works on any
    device; reads a tensor ``a_global_sf`` on the host (synchronises).
    """
    from .reference.nvfp4 import dequantize_reference

    m, k = rows_and_cols(fp4, m, k)
    return dequantize_reference(fp4, sf, a_global_sf, _layout(sfLayout), m, k)


def rows_and_cols(fp4, m: Optional[int], k: Optional[int]) -> Tuple[int, int]:
    """``(m, k)`` of packed NVFP4 data: the given values, or those of a 2-D ``[m, k // 2]`` ``fp4``."""
    if m is None or k is None:
        if not isinstance(fp4, torch.Tensor) or fp4.dim() != 2:
            raise ValueError("m, k: required unless fp4 is a 2-D [m, k // 2] tensor")
        m = fp4.shape[0] if m is None else m
        k = 2 * fp4.shape[1] if k is None else k
    return m, k


def example_call(params: dict, facts: dict, device) -> Tuple[object, tuple]:
    """Random inputs for one problem of the ``nvfp4_quantize`` spec (``gdnjit tune`` times variants on
    them): the named call and the tensors it points into (keep them alive while it runs)."""
    dtype = {v: k for k, v in _IN_DTYPES.items()}[params["in_dtype"]]
    a = (torch.randn(facts["M"], params["K"], device=device) * 3).to(dtype)
    gs = torch.tensor([448.0 * 6.0 / 10.0], device=device)
    layout = {v: k for k, v in _LAYOUT_PARAM.items()}[params["sf_layout"]]
    fp4, sf, call = _prepare(a, gs, layout, enable_pdl=params["pdl"])
    return call, (a, gs, fp4, sf)
