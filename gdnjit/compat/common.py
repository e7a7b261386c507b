"""Argument mapping shared by the engine compat modules."""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import DtypeError
from ..gdn import MAX_T


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
