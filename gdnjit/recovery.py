"""FlashInfer 0.7.2.post1's state-recovery arguments of ``gated_delta_rule_mtp`` as a per-token write map.

FlashInfer's bf16-state module (``flashinfer.gdn_kernels.gdn_decode_bf16_state.gated_delta_rule_mtp``) takes three
arguments its public ``gdn_decode`` API does not: ``accepted_steps`` (per request, the last accepted draft step
``K_n - 1``), ``recovery_steps`` (the same for every request) and ``disable_output``. Each says which token's state
goes to which pool slot, so gdnjit runs them through its per-token pool write (``ssm_state_indices``: the state after
token t goes to slot ``map[n, t]``, a negative entry writes nothing) with a map built here by two element-wise
torch ops on the device (no host read: graph capturable):

- ``accepted_steps`` with the pool updated: ``map[n, K_n - 1]`` = the request's write slot (``output_state_indices[n]``,
  else its read slot), every other entry -1: h_{K_n} is the only pool write (FlashInfer's state recovery with
  ``disable_output``, and its fused recovery + decode whose outputs from token K_n on come from the same state chain);
- ``accepted_steps`` with ``ssm_state_indices``: the caller's map with the columns after ``K_n - 1`` set to -1;
- ``recovery_steps = R > 0``: ``map[n, R - 1]`` = the write slot for every request (R = T: the plain update);
- ``accepted_steps`` with ``disable_state_update``: no map (nothing is written either way); at T = 1 (the only step
  is 0) the plain update;
- ``disable_output``: the kernel writes its outputs to a scratch tensor; the caller's ``output`` is left as it was.

Where FlashInfer leaves an output undefined (its state-only tokens, or tokens after ``K_n`` in its per-request
state-only mode) gdnjit writes the output of the same state chain. An ``accepted_steps`` value outside 0..T-1 writes
nothing for that request (``GDNJIT_CHECK_INDICES=1``: an IndexError on the host first).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import validate as _v
from .config import get_config
from .errors import DtypeError


class Recovery(NamedTuple):
    """What the kernel call gets in place of the caller's arguments."""
    ssm: Optional[torch.Tensor]  # the per-token write map (or the caller's ssm_state_indices)
    write_idx: Optional[torch.Tensor]  # output_state_indices for the kernel (None once folded into the map)
    scratch_output: bool  # disable_output: the kernel writes a scratch tensor, not the caller's output
    write_once: bool = False  # ssm is a map built here (at most one write per request): dispatched as a plain update


_PLAIN = Recovery(None, None, False)


def plan(q, initial_state_indices, output_state_indices, ssm_state_indices, intermediate_states_buffer, frozen: bool,
         accepted_steps, recovery_steps, disable_output) -> Recovery:
    """The kernel-side form of FlashInfer's ``accepted_steps`` / ``recovery_steps`` / ``disable_output`` (module
    docstring); one-line errors for a bad value or a combination FlashInfer refuses or gdnjit does not provide."""
    if accepted_steps is None and disable_output is False and recovery_steps.__class__ is int and recovery_steps == 0:
        # the defaults, every call's path: kept cheap (a shared value for the most common call)
        if ssm_state_indices is None and output_state_indices is None:
            return _PLAIN
        return Recovery(ssm_state_indices, output_state_indices, False)
    scratch = _v.truthy("disable_output", disable_output)
    if isinstance(recovery_steps, bool) or not isinstance(recovery_steps, int):
        raise TypeError(f"recovery_steps: expected an int, got {type(recovery_steps).__name__}")
    if accepted_steps is None and recovery_steps == 0:
        return Recovery(ssm_state_indices, output_state_indices, scratch)
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(initial_state_indices, torch.Tensor):
        return Recovery(ssm_state_indices, output_state_indices, scratch)  # the kernel's checks name the argument
    B, T = q.shape[0], q.shape[1]
    if recovery_steps:
        if accepted_steps is not None:
            raise ValueError("recovery_steps: not with accepted_steps (per-request steps replace the scalar; pass one)")
        if not 0 <= recovery_steps <= T:
            raise ValueError(f"recovery_steps: expected 0..T={T}, got {recovery_steps}")
        if frozen:
            raise ValueError("recovery_steps: writes the state after token recovery_steps - 1, so "
                             "disable_state_update must be False")
        for name, x in (("intermediate_states_buffer", intermediate_states_buffer),
                        ("ssm_state_indices", ssm_state_indices)):
            if x is not None:
                raise ValueError(f"recovery_steps: not with {name} (FlashInfer's fused recovery writes one state)")
        _v.index_tensor("initial_state_indices", initial_state_indices, B, q.device)
        if recovery_steps == T:  # the state after the last token: the plain update's writeback
            return Recovery(None, output_state_indices, scratch)
        steps = torch.arange(T, device=q.device)
        return Recovery(_one_column(steps == recovery_steps - 1, initial_state_indices, output_state_indices), None,
                        scratch, True)
    _v.index_tensor("accepted_steps", accepted_steps, B, q.device, contiguous=False)
    if intermediate_states_buffer is not None:
        raise NotImplementedError("accepted_steps: with intermediate_states_buffer is not provided by gdnjit "
                                  "(per-request steps select pool writes: the per-token write map)")
    if get_config().check_indices and accepted_steps.numel():
        lo, hi = int(accepted_steps.min()), int(accepted_steps.max())
        if lo < 0 or hi >= T:
            raise IndexError(f"accepted_steps: expected values in 0..T-1={T - 1}, got {lo if lo < 0 else hi}")
    if frozen:
        return Recovery(None, output_state_indices, scratch)
    if T == 1 and ssm_state_indices is None:  # the only step is 0: the plain update (other values are out of range)
        return Recovery(None, output_state_indices, scratch)
    steps = torch.arange(T, device=q.device)
    acc = accepted_steps.to(steps.dtype).unsqueeze(1)
    if ssm_state_indices is not None:
        if not isinstance(ssm_state_indices, torch.Tensor) or ssm_state_indices.dim() != 2:
            return Recovery(ssm_state_indices, output_state_indices, scratch)  # the kernel's checks report it
        return Recovery(torch.where(steps.unsqueeze(0) <= acc, ssm_state_indices, -1), output_state_indices, scratch)
    _v.index_tensor("initial_state_indices", initial_state_indices, B, q.device)
    return Recovery(_one_column(steps.unsqueeze(0) == acc, initial_state_indices, output_state_indices), None, scratch,
                    True)


def _one_column(at: torch.Tensor, read_idx: torch.Tensor, write_idx: Optional[torch.Tensor]) -> torch.Tensor:
    """``[B, T]``: each request's write slot where ``at`` holds (a ``[T]`` or ``[B, T]`` mask), -1 elsewhere."""
    if write_idx is not None:
        _v.index_tensor("output_state_indices", write_idx, read_idx.shape[0], read_idx.device, contiguous=False)
        if write_idx.dtype != read_idx.dtype:
            raise DtypeError(f"output_state_indices: expected the same dtype as initial_state_indices "
                            f"({read_idx.dtype}), got {write_idx.dtype}")
    slots = (read_idx if write_idx is None else write_idx).unsqueeze(1)
    return torch.where(at, slots, -1).contiguous()
