"""What every calling mode of the ``gdn`` kernel shares: its limits and dtypes, the spec, PDL, index checks (and, with
:mod:`gdnjit.lazy`, the per-slot caches' size checks and layer views).

The calling modes are small modules over this core, each declaring its :class:`~gdnjit.call_mode.CallMode` once
and naming only the params and args it sets (``specs/gdn.yaml`` declares them all, with defaults):

- :mod:`gdnjit.gdn`: FlashInfer's decode and multi-token calls (and, through :mod:`gdnjit.recovery`, its state
  recovery);
- :mod:`gdnjit.gdn_engine`: vLLM's and SGLang's conventions (varlen, 2-D slot maps, trees, ReplaySSM caches);
- :mod:`gdnjit.replay`: FlashInfer's ReplaySSM commit;
- :mod:`gdnjit.spec_step`: gdnjit's fused speculative step and its flush.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import validate as _v
from .config import get_config
from .errors import DtypeError
from .runner import supports_pdl
from .spec import Spec, get_spec

SUPPORTED_DIMS = (64, 128, 256)
MAX_T = 16
IN_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

SPEC: Spec = get_spec("gdn")
# The engine-convention and calling-mode params at their native (FlashInfer) values: the spec's defaults. Tests and
# tools that spell out a full params dict take them from here.
CONVENTION_PARAMS = ("varlen", "bounded", "accepted", "tree", "inter_indexed", "null_slot", "padding", "gates",
                     "replay_cache", "replay", "track", "fused_step", "write_once")
NATIVE_CONVENTIONS = {n: dict(SPEC.param_defaults)[n] for n in CONVENTION_PARAMS}


def uses_pdl(device_index: int) -> bool:
    """Whether gdn kernels are launched with programmatic dependent launch on this device: GDNJIT_PDL
    on and sm_90+. Every gdn kernel waits (griddepcontrol.wait) before its first load or store, so it
    may overlap the end of the previous kernel (its L2 state prefetch runs before the wait)."""
    return get_config().pdl and supports_pdl(device_index)


def launch_device(device: torch.device, require_cuda: bool) -> int:
    """The device index a call on ``device`` launches on (``require_cuda=False``: a CPU test's call, device 0)."""
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if require_cuda else 0


def ptr(x: Optional[torch.Tensor]) -> int:
    """A tensor's address, 0 (a null pointer) for None."""
    return 0 if x is None else x.data_ptr()


def signature(x: Optional[torch.Tensor]):
    """The metadata a call's checks read of one tensor (None for None): a memo key part."""
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device)


def check_cache_sizes(layers, H: int, HV: int, **sizes) -> None:
    """A per-slot cache allocator's sizes (:func:`gdnjit.lazy_cache`, :func:`gdnjit.spec_cache`): each of ``sizes``,
    H and HV a positive int, ``layers`` None or a positive int, HV a multiple of H."""
    for name, x in (*sizes.items(), ("H", H), ("HV", HV)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"layers: expected None or a positive int, got {layers!r}")
    if HV % H:
        raise ValueError(f"HV: expected a multiple of H={H}, got {HV}")


def cache_layer(cache: tuple, i: int, lead: str):
    """Layer ``i`` of a cache (a NamedTuple of tensors) allocated with a leading layer dim: views, no copy. ``lead``
    names the field whose rank tells (a 2-D per-slot field: 3-D with the layer dim)."""
    if getattr(cache, lead).dim() != 3:
        raise ValueError(f"layer: this cache has no layer dim ({lead} shape {tuple(getattr(cache, lead).shape)})")
    return type(cache)(*(x[i] for x in cache))


def check_indices(name: str, idx: torch.Tensor, B: int, device: torch.device,
                  like: Optional[torch.Tensor] = None) -> None:
    """A required ``[B]`` int32 / int64 index tensor on ``device`` (of ``like``'s dtype when given)."""
    _v.tensor(name, idx, 1)  # required here (index_tensor takes None as "absent")
    _v.index_tensor(name, idx, B, device)
    if like is not None and idx.dtype != like.dtype:
        raise DtypeError(f"{name}: expected the same dtype as initial_state_indices ({like.dtype}), got {idx.dtype}")


def check_tokens(q, k, v, a, b, B: int, HV: int, K: int, V: int, device: torch.device, what: str = "tokens") -> tuple:
    """A step's token inputs: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, a, b ``[B, T, HV]``, all of q's dtype (bf16 /
    fp16) on ``device``, T (``what`` in messages) in 1..MAX_T, H dividing HV; returns (T, H). Strides are the caller's
    to check."""
    _v.tensor("q", q, 4)
    if q.dtype not in IN_DTYPES:
        raise DtypeError(f"q: expected dtype bfloat16 or float16, got {str(q.dtype).replace('torch.', '')}")
    _v.same_device("q", q, device)
    B_q, T, H, Kq = q.shape
    if B_q != B:
        raise ValueError(f"q: expected B={B} rows (state_indices' length), got shape {tuple(q.shape)}")
    if Kq != K:
        raise ValueError(f"q: expected K={K} (the state's last dim), got shape {tuple(q.shape)}")
    if not 1 <= T <= MAX_T:
        raise ValueError(f"q: the {what} T (dim 1) must be in 1..{MAX_T}, got {T}")
    if H < 1 or HV % H:
        raise ValueError(f"q: its heads H={H} (dim 2) must divide the state's value heads HV={HV}")
    for name, x, shape, dims in (("k", k, (B, T, H, K), "[B, T, heads, dim]"),
                                 ("v", v, (B, T, HV, V), "[B, T, heads, dim]"),
                                 ("a", a, (B, T, HV), "[B, T, HV]"), ("b", b, (B, T, HV), "[B, T, HV]")):
        _v.tensor(name, x, len(shape))
        _v.dtype_in(name, x, (q.dtype,))
        _v.same_device(name, x, device)
        _v.shape_is(name, x, shape, dims)
    return T, H
