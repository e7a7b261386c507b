"""Argument mapping shared by the engine compat modules."""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import DtypeError
from ..gdn import MAX_T
from .launch import step


def gate_view(name: str, x: torch.Tensor, lead: tuple, like: torch.Tensor) -> torch.Tensor:
    """An engine's gate input (``[N, T, HV]``, ``[1, total, HV]`` or ``[total, HV]``) as ``[*lead, HV]`` (a view
    when the memory allows it, else a copy)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 3 and tuple(x.shape[:2]) == tuple(lead):
        return x
    if x.dim() in (2, 3) and x.shape[-1] > 0 and x.numel() == lead[0] * lead[1] * x.shape[-1]:
        return x.reshape(*lead, x.shape[-1])
    raise ValueError(f"{name}: expected shape [{lead[0]}, {lead[1]}, HV] or [{lead[0] * lead[1]}, HV], "
                     f"got {tuple(x.shape)}")


def int32(name: str, x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``x`` as int32 (the kernels read int32 offsets / counts / parents; int64 is converted, one small copy)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.int32:
        return x
    if x.dtype != torch.int64:
        raise DtypeError(f"{name}: expected dtype int32 or int64, got {str(x.dtype).replace('torch.', '')}")
    return x.to(torch.int32)


def offsets(name: str, x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A varlen call's ``cu_seqlens`` (``[N + 1]`` request offsets) as int32 (:func:`int32`), checked 1-D: the compat
    calls count the requests from it before the step's own checks."""
    x = int32(name, x)
    if x is not None and x.dim() != 1:
        raise ValueError(f"{name}: expected 1 dimensions [N + 1] (request offsets), got shape {tuple(x.shape)}")
    return x


def state_pool(name: str, x) -> torch.Tensor:
    """An engine's state pool argument, checked to be a tensor (its dims and dtype are the step's to check)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor [slots, HV, V, K], got {type(x).__name__}")
    return x


def expected_tokens(total: int, n: int) -> int:
    """Tokens per request the dispatch assumes for varlen calls without a per-token buffer (the mean, in 1..MAX_T):
    only a hint, such requests may be longer."""
    if n <= 0:
        return 1
    return max(1, min(MAX_T, -(-total // n)))


def scale_of(scale, K: int) -> float:
    """The engines' ``scale``: None -> K ** -0.5; an explicit value must be a positive number."""
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a Python float or None, got {type(scale).__name__}")
    if not scale > 0:
        raise ValueError(f"scale: expected a positive float, got {scale!r}")
    return float(scale)


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, l2norm: bool,
                  null_slot: str, *, round_beta: bool):
    """vLLM's and SGLang's packed decode (one token per request, q / k / v read from the conv output's packed
    ``[q | k | v]`` rows): the arguments checked and mapped onto one engine step (T = 1, outputs into ``out``, zeros
    for padding rows); ``null_slot`` and ``round_beta`` are where the two engines' kernels differ."""
    if not isinstance(mixed_qkv, torch.Tensor) or mixed_qkv.dim() != 2:
        raise ValueError(f"mixed_qkv: expected a 2-D tensor [B, 2 * H * K + HV * V], got "
                         f"{tuple(mixed_qkv.shape) if isinstance(mixed_qkv, torch.Tensor) else type(mixed_qkv).__name__}")
    if mixed_qkv.shape[1] > 1 and mixed_qkv.stride(1) != 1:
        raise ValueError(f"mixed_qkv: the last dim must be contiguous (stride 1), got strides {mixed_qkv.stride()}")
    if not isinstance(initial_state, torch.Tensor) or initial_state.dim() != 4:
        raise ValueError("initial_state: expected a 4-D tensor [slots, HV, V, K]")
    HV, V, K = initial_state.shape[1:]
    B = mixed_qkv.shape[0]
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (B, HV):
            raise ValueError(f"{name}: expected shape [B={B}, HV={HV}], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(ssm_state_indices, torch.Tensor) or ssm_state_indices.dim() != 1:
        raise ValueError("ssm_state_indices: expected a 1-D tensor [B] (packed decode: one slot per request)")
    qk = mixed_qkv.shape[1] - HV * V
    if qk <= 0 or qk % (2 * K):
        raise ValueError(f"mixed_qkv: width {mixed_qkv.shape[1]} is not 2 * H * K + HV * V for K={K}, HV={HV}, V={V}")
    H = qk // (2 * K)
    if HV % H:
        raise ValueError(f"mixed_qkv: the inferred q/k heads H={H} must divide HV={HV}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, 1, HV, V) or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous tensor of shape [{B}, 1, {HV}, {V}], got "
                         f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
                         f"{'' if not isinstance(out, torch.Tensor) or out.is_contiguous() else ' (strided)'}")
    q = mixed_qkv[:, :H * K].unflatten(1, (1, H, K))  # [B, 1, H, K] views of the packed rows
    k = mixed_qkv[:, H * K:2 * H * K].unflatten(1, (1, H, K))
    v = mixed_qkv[:, 2 * H * K:].unflatten(1, (1, HV, V))
    step(q, k, v, A_log, a.unsqueeze(1), dt_bias, b.unsqueeze(1), initial_state, T=1, read_idx=ssm_state_indices,
         update=True, null_slot=null_slot, padding="skip", gates="raw", scale=scale_of(scale, K), l2norm=l2norm,
         softplus_beta=1.0, softplus_threshold=20.0, output=out, zero_padding=True, round_beta=round_beta)
    return out, initial_state
