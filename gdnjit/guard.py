"""A C++ check that tensors still have the metadata of an already-validated call.

The ops' hot path (:func:`gdnjit.gdn.run`) skips validation for a call whose tensors have the
same shapes, strides, dtypes and devices as one validated before. Reading that metadata in Python
costs ~0.3 us per tensor (13 tensors per GDN call); torch's own guard object, the one torch.compile
uses to decide whether a compiled graph may be reused (``torch._C._dynamo.guards.TensorGuards``),
compares dtype, device, dispatch keys (layout, device type), requires_grad, sizes and strides of a
list of tensors against a snapshot in C++ at ~0.1 us per tensor. It is stricter than the ops need
(requires_grad, dispatch keys, one object passed in two slots): a stricter check only sends a call to
the Python signature path, never skips a check.

It is a private torch API, so :func:`make` first checks, once, that it exists and behaves as
described (static sizes and strides); when it does not, :func:`make` returns None and callers keep
their Python signature path (slower, same results).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence


def _build(cls, tensors: Sequence):
    return cls(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
               dynamic_dims_strides=[list(t.stride()) for t in tensors])


@functools.lru_cache(maxsize=1)
def _guard_class():
    """TensorGuards if it exists here and passes a self-test of the checks the ops rely on, else None."""
    try:
        import torch
        from torch._C._dynamo.guards import TensorGuards
    except Exception:
        return None
    try:
        x, y = torch.zeros(4, 8), torch.zeros(3, dtype=torch.int32)
        g = _build(TensorGuards, (x, y))
        probes = [
            ((torch.ones(4, 8), torch.ones(3, dtype=torch.int32)), True),
            ((torch.zeros(4, 9), y), False),                       # size
            ((torch.zeros(8, 4).t(), y), False),                   # strides
            ((torch.zeros(4, 16)[:, ::2], y), False),              # strides, same size
            ((torch.zeros(4, 8, 1), y), False),                    # rank
            ((x.double(), y), False),                              # dtype
            ((x, torch.zeros(3, dtype=torch.int64)), False),       # dtype of a later slot
            ((torch.zeros(4, 8, device="meta"), y), False),        # device type
            ((x.to_sparse(), y), False),                           # layout
            ((x, 3), False),                                       # not a tensor
        ]
        if any(bool(g.check(*args)) is not want for args, want in probes):
            return None
    except Exception:
        return None
    return TensorGuards


def available() -> bool:
    """Whether :func:`make` returns guards in this process (the torch API exists and passed its self-test)."""
    return _guard_class() is not None


def make(tensors: Sequence) -> Optional[object]:
    """A guard whose ``check(*tensors2)`` is true only if every tensor of ``tensors2`` has the dtype,
    device, layout, requires_grad, sizes and strides of the one in the same slot of ``tensors`` (and no
    object appears twice); None when torch's guard is unavailable. Holds no reference to the tensors."""
    cls = _guard_class()
    return None if cls is None else _build(cls, tensors)
