"""Harness stand-in for ``flashinfer.gdn_kernels.gdn_decode_bf16_wy_output_only``: an adapter onto gdnjit.

FlashInfer's output-only bf16 MTP kernel: same call signature as
``gdn_decode_bf16_state.gated_delta_rule_mtp``, never writes the pool, always l2-normalises
q/k, and refuses state updates' companions (buffer, split pool, FLA scatter, recovery) with
NotImplementedError as FlashInfer does. Here it is gdnjit's ``gated_delta_rule_mtp`` with
``disable_state_update=True`` (frozen pool), output bf16.
"""

from __future__ import annotations

from typing import Optional

import torch

from .gdn_decode_bf16_state import _run


def gated_delta_rule_mtp(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    q: Optional[torch.Tensor] = None,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    b: Optional[torch.Tensor] = None,
    initial_state_source: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    disable_output: bool = False,
    recovery_steps: int = 0,
) -> torch.Tensor:
    """Output-only (frozen pool) bf16 MTP -> gdnjit's ``gated_delta_rule_mtp(disable_state_update=True)``."""
    name = "gdn_decode_bf16_wy_output_only"
    if recovery_steps != 0:
        raise NotImplementedError(f"{name}: recovery_steps>0 is not supported (output-only kernel)")
    if disable_output:
        raise NotImplementedError(f"{name}: disable_output=True is not supported (output-only kernel)")
    if intermediate_states_buffer is not None:
        raise NotImplementedError(f"{name}: intermediate-state caching is not supported")
    if accepted_steps is not None or ssm_state_indices is not None:
        raise NotImplementedError(f"{name}: per-request K / FLA scatter is not supported")
    if output_state_indices is not None:
        raise NotImplementedError(f"{name}: split pool (output_state_indices) is not supported")
    assert use_qk_l2norm_in_kernel, f"{name}: use_qk_l2norm_in_kernel=False is not supported"
    if initial_state_indices is None and q is not None:
        initial_state_indices = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)
    return _run(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                q=q, k=k, v=v, b=b, initial_state_source=initial_state_source,
                initial_state_indices=initial_state_indices, disable_state_update=True,
                use_qk_l2norm_in_kernel=True, scale=scale, output=output)
