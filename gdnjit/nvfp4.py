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
from .reference.nvfp4 import FourOverSix
from .runner import RUNNER, KernelCall, device_info
from .sf_layout import SfLayout, padded_sf_shape, to_sf_layout
from .spec import get_spec

__all__ = ["nvfp4_quantize", "fp4_quantize", "dequantize_nvfp4", "SfLayout", "BACKENDS", "FourOverSix",
           "fast_math_from_env", "four_over_six_from_env", "resolve_four_over_six"]

SPEC = "nvfp4_quantize"
BACKENDS = ("gdnjit", "cuda", "cute-dsl", "reference")
"""``gdnjit`` (and FlashInfer's spellings ``cuda`` / ``cute-dsl``, whose results FlashInfer keeps identical): the
JIT kernel. ``reference``: the torch reference (slow, synchronises; any device). FlashInfer's ``cake`` (its
experimental generated per-token kernel) is not provided: per-token scales run on the JIT kernel."""
FAST_MATH_ENV = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")
FOUR_OVER_SIX_ENV = ("FLASHINFER_NVFP4_4OVER6", "FLASHINFER_NVFP4_4OVER6_ERR_MODE", "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH",
                     "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256")
PER_TOKEN_SCALE_RTOL = 1e-3  # FlashInfer's check that a per-token scale matches an explicit 4over6 recipe
UNSET = object()
SF_VEC_SIZE = 16
_IN_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4m3"}
_LAYOUT_PARAM = {SfLayout.layout_128x4: "128x4", SfLayout.layout_8x4: "8x4", SfLayout.layout_linear: "linear"}
_MIN_ARCH = 89       # cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2 (Ada, Hopper and newer)
_HW_E2M1_ARCH = 100  # cvt.rn.satfinite.e2m1x2.f32 (sm_100a / sm_103a / sm_110a / sm_120a / sm_121a)
_PDL_ARCH = 90  # griddepcontrol.wait / launch_dependents (sm_90+)
_MAX_SF_BYTES = 2**32 - 2**12  # the kernel's 32-bit scale-byte offsets, with room for the last CTA's threads
_F32 = struct.Struct("f")




def to_layout(sfLayout) -> SfLayout:
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


def choose_recipe(fast_math, in_dtype) -> str:
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
    layout = to_layout(sfLayout)
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


def four_over_six_from_env(environ=None) -> Optional[FourOverSix]:
    """FlashInfer's legacy 4over6 switch, read per call as FlashInfer does: on only when ``FLASHINFER_NVFP4_4OVER6``
    is exactly ``"1"``, with ``FLASHINFER_NVFP4_4OVER6_ERR_MODE`` (``MAE`` (default) / ``MSE``, any case),
    ``..._ERR_USE_FAST_MATH`` and ``..._E4M3_USE_256`` (each on when ``"1"``)."""
    env = os.environ if environ is None else environ
    if env.get("FLASHINFER_NVFP4_4OVER6") != "1":
        return None
    mode = env.get("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "MAE")
    if mode.upper() not in ("MAE", "MSE"):
        raise ValueError(f"FLASHINFER_NVFP4_4OVER6_ERR_MODE: expected MAE or MSE, got {mode!r}")
    return FourOverSix(mode.lower(), env.get("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH") == "1",
                       256 if env.get("FLASHINFER_NVFP4_4OVER6_E4M3_USE_256") == "1" else 448)


def resolve_four_over_six(setting=UNSET) -> Optional[FourOverSix]:
    """An ``nvfp4_4over6`` argument as the recipe the kernels take: omitted -> the environment
    (:func:`four_over_six_from_env`), None -> off, a :class:`FourOverSix` as is, or any object with FlashInfer's
    ``NVFP44Over6Config`` fields (``e4m3_max`` 256 / 448, ``err_mode`` "MAE" / "MSE" or its enum, ``err_use_fast_math``)."""
    if setting is UNSET:
        return four_over_six_from_env()
    if setting is None:
        return None
    if isinstance(setting, FourOverSix):
        cfg = setting
    else:
        try:
            e4m3_max, mode, fp16 = setting.e4m3_max, setting.err_mode, setting.err_use_fast_math
        except AttributeError:
            raise TypeError(f"nvfp4_4over6: expected None, a FourOverSix or an object with FlashInfer's "
                            f"NVFP44Over6Config fields, got {type(setting).__name__}") from None
        name = mode.upper() if isinstance(mode, str) else getattr(mode, "name", None)
        if name is None and isinstance(mode, int) and not isinstance(mode, bool):
            name = {0: "MAE", 1: "MSE"}.get(mode)
        if name not in ("MAE", "MSE"):
            raise ValueError(f"nvfp4_4over6: err_mode expected MAE or MSE, got {mode!r}")
        cfg = FourOverSix(name.lower(), fp16, e4m3_max)
    if cfg.err_mode not in ("mae", "mse") or not isinstance(cfg.err_fp16, bool) or cfg.e4m3_max not in (256, 448):
        raise ValueError(f"nvfp4_4over6: expected err_mode MAE / MSE, a bool err_use_fast_math and e4m3_max 256 / 448, "
                         f"got {setting!r}")
    return cfg


def check_flashinfer_extras(a, a_global_sf, backend, per_token_activation, expanded_idx_to_permuted_idx, out_scale,
                             nvfp4_4over6) -> Optional[FourOverSix]:
    """FlashInfer 0.7.2's further nvfp4_quantize arguments, checked as FlashInfer checks them; returns the 4over6
    recipe (None: off). fp8 input has none: an explicit recipe is FlashInfer's ValueError, one from the environment is
    ignored (as FlashInfer's CUDA backend does)."""
    if not isinstance(per_token_activation, bool):
        raise TypeError(f"per_token_activation: expected a bool, got {type(per_token_activation).__name__}")
    explicit = nvfp4_4over6 is not UNSET
    four6 = resolve_four_over_six(nvfp4_4over6)
    if getattr(a, "dtype", None) == torch.float8_e4m3fn and four6 is not None:
        if explicit:
            raise ValueError("nvfp4_4over6: NVFP4 4over6 requires float16 or bfloat16 input, got float8_e4m3fn")
        four6 = None
    if per_token_activation:
        if out_scale is not None and backend == "cuda":
            raise ValueError("out_scale: only with backend 'gdnjit', 'cute-dsl' or 'reference' (as in FlashInfer, "
                             "not 'cuda')")
        if expanded_idx_to_permuted_idx is not None and backend == "cute-dsl":
            raise ValueError("expanded_idx_to_permuted_idx: not with backend 'cute-dsl' (as in FlashInfer)")
        if explicit and isinstance(a_global_sf, (int, float)) and not isinstance(a_global_sf, bool):
            want = 1.0 / ((448 if four6 is None else four6.e4m3_max) * 6.0)
            if abs(float(a_global_sf) - want) > PER_TOKEN_SCALE_RTOL * want:
                raise ValueError(f"a_global_sf: {a_global_sf!r} does not match the requested 4over6 recipe "
                                 f"{four6!r}, which implies 1 / (e4m3_max * 6) = {want!r}")
    else:
        if out_scale is not None:
            raise ValueError("out_scale: only with per_token_activation=True (as in FlashInfer)")
        if expanded_idx_to_permuted_idx is not None:
            raise ValueError("expanded_idx_to_permuted_idx: only with per_token_activation=True (as in FlashInfer)")
    return four6


def _row_map(row_map, M: int, device, require_cuda: bool):
    """FlashInfer's expanded_idx_to_permuted_idx: a 1-D int32 tensor on ``a``'s device, at least M entries."""
    if row_map is None:
        return None
    (_v.cuda_tensor if require_cuda else _v.tensor)("expanded_idx_to_permuted_idx", row_map)
    if row_map.dtype != torch.int32:
        raise DtypeError(f"expanded_idx_to_permuted_idx: expected dtype int32, got "
                         f"{str(row_map.dtype).replace('torch.', '')}")
    if row_map.dim() != 1 or row_map.numel() < M:
        raise ValueError(f"expanded_idx_to_permuted_idx: expected a 1-D tensor of at least {M} entries (one per row "
                         f"of a), got shape {tuple(row_map.shape)}")
    if row_map.device != device:
        raise ValueError(f"expanded_idx_to_permuted_idx: expected a tensor on {device} (like a), got {row_map.device}")
    if row_map.stride(0) != 1:
        raise ValueError(f"expanded_idx_to_permuted_idx: expected a contiguous tensor, got stride {row_map.stride()}")
    return row_map


def _out_scale(out_scale, device):
    """(device pointer or 0, value, the tensor to keep alive) of out_scale: a one-element float tensor (converted to
    float32 on ``device``, a copy, where it is not; read by the kernel) or a Python number (a kernel argument: no copy,
    graph-safe); none: 1 (an exact identity)."""
    if out_scale is None:
        return 0, 1.0, None
    if isinstance(out_scale, torch.Tensor):
        if out_scale.numel() != 1 or not out_scale.dtype.is_floating_point:
            raise ValueError(f"out_scale: expected a one-element float tensor, got shape {tuple(out_scale.shape)} "
                             f"dtype {str(out_scale.dtype).replace('torch.', '')}")
        if out_scale.dtype != torch.float32 or out_scale.device != device:
            out_scale = out_scale.to(device=device, dtype=torch.float32)
        return out_scale.data_ptr(), 1.0, out_scale
    if isinstance(out_scale, bool) or not isinstance(out_scale, (int, float)):
        raise TypeError(f"out_scale: expected a one-element tensor or a number, got {type(out_scale).__name__}")
    try:
        value = _F32.unpack(_F32.pack(float(out_scale)))[0]  # the value the kernel will see
    except OverflowError:
        value = math.copysign(math.inf, float(out_scale))
    return 0, value, None


def prepare(a, a_global_sf, sfLayout=SfLayout.layout_128x4, do_shuffle=False, sf_vec_size=16, enable_pdl=None,
             backend="gdnjit", require_cuda: bool = True, arch: Optional[str] = None, recipe: str = "fast", *,
             per_token: bool = False, four_over_six: Optional[FourOverSix] = None, row_map=None, out_scale=None):
    """All argument checks and the output allocation.

    Returns ``(fp4, sf, call)`` where ``call`` is the named :class:`~gdnjit.runner.KernelCall`, or None
    when there is nothing to launch (M == 0); with ``per_token`` ``(fp4, sf, per_token_scale, call)``.
    ``require_cuda=False`` (with ``arch``, e.g. ``'sm_90'``) lets CPU tests exercise every other check with CPU
    tensors. ``recipe``: the spec's ``fast`` / ``exact`` (:func:`_recipe` turns FlashInfer's switch into it);
    ``four_over_six`` the 4over6 recipe (None: off); ``row_map`` / ``out_scale`` (per-token mode): FlashInfer's
    ``expanded_idx_to_permuted_idx`` / ``out_scale``.
    """
    (_v.cuda_tensor if require_cuda else _v.tensor)("a", a)
    if a.dtype not in _IN_DTYPES:
        raise DtypeError(f"a: expected dtype float16, bfloat16 or float8_e4m3fn, got {str(a.dtype).replace('torch.', '')}")
    if (per_token or four_over_six is not None) and a.dtype == torch.float8_e4m3fn:
        raise DtypeError(f"a: per-token scales and 4over6 take float16 or bfloat16 input (as FlashInfer's), got "
                         f"float8_e4m3fn")
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
    row_map = _row_map(row_map, M, device, require_cuda) if per_token else None
    osc_ptr, osc_value, osc_tensor = _out_scale(out_scale, device) if per_token else (0, 1.0, None)
    # a row map may leave rows out: their outputs are zeros (FlashInfer: the scales zeros, codes and per-token
    # scales uninitialised)
    alloc = torch.zeros if row_map is not None else torch.empty
    fp4 = alloc((M, K // 2), dtype=torch.uint8, device=device)
    sf = alloc((sf_rows, sf_cols), dtype=torch.uint8, device=device)
    pts = alloc((M,), dtype=torch.float32, device=device) if per_token else None
    outs = (fp4, sf, pts) if per_token else (fp4, sf)
    if M == 0:
        return (*outs, None)

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
                  pdl=pdl, recipe=recipe, scale="token" if per_token else "tensor",
                  four_over_six="off" if four_over_six is None else four_over_six.param)
    args = dict(x=x.data_ptr(), q=fp4.data_ptr(), sf=sf.data_ptr(), gs_ptr=gs_ptr, x_stride=x.stride(0), M=M,
                sf_rows=sf_rows, gs_value=gs_value, pts=pts.data_ptr() if per_token else 0,
                perm=row_map.data_ptr() if row_map is not None else 0, osc_ptr=osc_ptr, osc_value=osc_value,
                err_denom=6.0 * (448 if four_over_six is None else four_over_six.e4m3_max))
    return (*outs, KernelCall(spec, params, dict(M=M), args, dev, pdl=pdl))


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
    nvfp4_4over6=UNSET,
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
        per_token_activation: FlashInfer's per-token activation scales (fp16 / bf16 input): ``a_global_sf`` is
            then the inverse base scale ``1 / (e4m3_max * 6)`` (a number, or a one-element tensor read by the
            kernel), each row is quantized with its own scale from its amax, and the call returns those per-token
            (decode) scales too (docs/design.md 5.6).
        expanded_idx_to_permuted_idx: per-token mode: an int32 ``[>= M]`` row map on ``a``'s device; row
            ``map[i]`` is quantized for each ``i < M`` (negative: none); rows no entry names get zero outputs.
            FlashInfer's ValueError without per-token mode or with ``backend="cute-dsl"``.
        out_scale: per-token mode: a scalar (one-element tensor or number) the returned per-token scales are
            multiplied by (the codes and block scales do not change). FlashInfer's ValueError without per-token
            mode or with ``backend="cuda"``.
        nvfp4_4over6: FlashInfer's 4over6 block-scale search (fp16 / bf16 input): omitted -> its environment
            switch ``FLASHINFER_NVFP4_4OVER6=1`` (with ``..._ERR_MODE``, ``..._ERR_USE_FAST_MATH``,
            ``..._E4M3_USE_256``), read per call; None -> off; a :class:`FourOverSix` or FlashInfer's
            ``NVFP44Over6Config`` -> that recipe (:func:`resolve_four_over_six`). Explicit with fp8 input:
            ValueError (from the environment it is ignored for fp8, as FlashInfer does). In per-token mode with
            an explicit recipe, a number ``a_global_sf`` must match ``1 / (e4m3_max * 6)`` within 1e-3.
        fast_math: the recipe. None (default): FlashInfer's switch, read per call as FlashInfer does:
            fast unless ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH`` (or ``TRTLLM_...``) is ``"1"``. False: the
            exact recipe (TransformerEngine's; docs/design.md section 5). fp8 input is always fast.

    Returns:
        ``(fp4, sf)``, or ``(fp4, sf, per_token_scale)`` (float32 ``[M]``) with ``per_token_activation``:
        ``fp4`` uint8 ``[M, K // 2]`` (element ``2i`` in the low nibble);
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
    four6 = check_flashinfer_extras(a, a_global_sf, backend, per_token_activation, expanded_idx_to_permuted_idx,
                                     out_scale, nvfp4_4over6)
    recipe = choose_recipe(fast_math, getattr(a, "dtype", None))
    if backend == "reference" or backend not in BACKENDS:  # options (an unknown backend) before the device
        layout = _check_options(sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend)
        from .reference.nvfp4 import quantize_reference

        if per_token_activation:
            return quantize_reference(a, a_global_sf, layout, recipe, per_token=True, four_over_six=four6,
                                      row_map=expanded_idx_to_permuted_idx, out_scale=out_scale)
        return quantize_reference(a, a_global_sf, layout, recipe, four_over_six=four6)
    *outs, call = prepare(a, a_global_sf, sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend, recipe=recipe,
                           per_token=per_token_activation, four_over_six=four6, row_map=expanded_idx_to_permuted_idx,
                           out_scale=out_scale)
    if call is not None:
        RUNNER.launch(call)
    return tuple(outs)


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
    nvfp4_4over6=UNSET,
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
    FlashInfer's NotImplementedError too. ``fast_math``, the recipe switch and ``nvfp4_4over6`` as in
    :func:`nvfp4_quantize`.
    """
    for name, flag in (("sf_use_ue8m0", sf_use_ue8m0), ("is_sf_swizzled_layout", is_sf_swizzled_layout),
                       ("is_sf_8x4_layout", is_sf_8x4_layout), ("is_global_scale_inversed", is_global_scale_inversed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if isinstance(sf_vec_size, bool) or sf_vec_size not in (16, 32):
        raise NotImplementedError(f"sf_vec_size: can only be 16 or 32, got {sf_vec_size!r}")
    if (sf_vec_size == 32 or sf_use_ue8m0) and nvfp4_4over6 is not UNSET and nvfp4_4over6 is not None:
        raise ValueError(f"nvfp4_4over6: applies to NVFP4 only (sf_vec_size=16, sf_use_ue8m0=False); got "
                         f"sf_vec_size={sf_vec_size}, sf_use_ue8m0={sf_use_ue8m0} (as in FlashInfer)")
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
    return dequantize_reference(fp4, sf, a_global_sf, to_layout(sfLayout), m, k)


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
    per_token = params["scale"] == "token"
    gs = torch.tensor([1.0 / 2688.0 if per_token else 448.0 * 6.0 / 10.0], device=device)
    layout = {v: k for k, v in _LAYOUT_PARAM.items()}[params["sf_layout"]]
    f6 = params["four_over_six"]
    four6 = None if f6 == "off" else FourOverSix(f6[:3], f6.endswith("_fp16"))
    *outs, call = prepare(a, gs, layout, enable_pdl=params["pdl"], recipe=params["recipe"], per_token=per_token,
                           four_over_six=four6)
    return call, (a, gs, *outs)
