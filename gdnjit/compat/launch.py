"""One engine step from the compat modules: the eager function, or its torch custom op while torch.compile
traces (the op: ``torch.ops.gdnjit.engine_step``, registered by :mod:`gdnjit.torch_ops`)."""

from __future__ import annotations

import torch

from ..gdn_engine import engine_step


def step(q, k, v, A_log, a, dt_bias, b, state, **kw) -> torch.Tensor:
    """:func:`gdnjit.gdn_engine.engine_step` (keywords as there); traced, or on CPU tensors (the float32 torch
    reference), through the custom op."""
    if torch.compiler.is_compiling() or (isinstance(q, torch.Tensor) and q.device.type == "cpu"):
        from .. import torch_ops

        return torch_ops.engine_step(q, k, v, A_log, a, dt_bias, b, state, **kw)
    return engine_step(q, k, v, A_log, a, dt_bias, b, state, **kw)
