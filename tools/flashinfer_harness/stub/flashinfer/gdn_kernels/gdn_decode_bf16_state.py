"""Harness stand-in for ``flashinfer.gdn_kernels.gdn_decode_bf16_state``: adapters onto gdnjit.

FlashInfer's tests call this module's bf16-state pool kernels directly, as a second
implementation beside the public API. Their math and pool semantics are those of
:func:`gdnjit.gdn.gated_delta_rule_mtp` over a bf16 ``[pool, HV, V, K]`` pool, so each
function here checks FlashInfer's documented contract for it, then calls gdnjit:

* keyword-style arguments (``initial_state_source``, ``use_qk_l2norm_in_kernel``,
  ``softplus_beta`` = 1.0 and ``softplus_threshold`` = 20.0, the only values gdnjit has);
* pool mode only, bf16 state, K = V = 128; returns only the output, which is bf16
  (allocated zeroed when not given);
* ``disable_state_update`` defaults to False here (not None as in the public mtp).

The state-recovery arguments (``accepted_steps``, ``recovery_steps``, ``disable_output``) go to
gdnjit's own (``gdnjit.recovery``). Known difference, left to show in the tests: a negative read
index is a padding row in gdnjit (nothing read or written), whereas FlashInfer's bf16 kernels
redirect it to pool slot 0 and write that slot.
"""

from __future__ import annotations

from typing import Optional

import torch

from gdnjit.gdn import gated_delta_rule_mtp as _gdnjit_mtp


def _not_in_gdnjit(feature: str):
    return NotImplementedError(f"{feature}: FlashInfer bf16-state kernel feature that gdnjit does not provide "
                               "(tools/flashinfer_harness stand-in)")


def _run(*, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
         initial_state_indices, output_state_indices=None, intermediate_states_buffer=None, ssm_state_indices=None,
         disable_state_update=False, use_qk_l2norm_in_kernel=True, scale=None, output=None, accepted_steps=None,
         recovery_steps=0, disable_output=False) -> torch.Tensor:
    assert q is not None and k is not None and v is not None
    assert b is not None and initial_state_source is not None
    if softplus_beta != 1.0 or softplus_threshold != 20.0:
        raise _not_in_gdnjit(f"softplus_beta={softplus_beta}, softplus_threshold={softplus_threshold} "
                             "(gdnjit's softplus is fixed at beta=1.0, threshold=20.0)")
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert K == 128 and V == 128, f"K and V must be 128, got K={K}, V={V}"
    assert initial_state_source.dtype == torch.bfloat16
    assert initial_state_indices is not None, "Pool mode is required: pass initial_state_indices."
    if output is None:
        output = torch.zeros((B, T, HV, V), dtype=torch.bfloat16, device=q.device)
    assert output.dtype == torch.bfloat16, f"output must be bf16; got {output.dtype}"
    out, _ = _gdnjit_mtp(q, k, v, initial_state_source, initial_state_indices, A_log, a, dt_bias, b, scale=scale,
                         output=output, intermediate_states_buffer=intermediate_states_buffer,
                         ssm_state_indices=ssm_state_indices, disable_state_update=bool(disable_state_update),
                         use_qk_l2norm=use_qk_l2norm_in_kernel, output_state_indices=output_state_indices,
                         accepted_steps=accepted_steps, recovery_steps=recovery_steps, disable_output=disable_output)
    return out


def gated_delta_rule(
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
    output: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """T = 1 decode over a bf16 pool -> gdnjit's ``gated_delta_rule_mtp`` (state updated)."""
    assert q is not None and q.shape[1] == 1, f"This kernel only supports T=1, got T={None if q is None else q.shape[1]}"
    return _run(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                q=q, k=k, v=v, b=b, initial_state_source=initial_state_source,
                initial_state_indices=initial_state_indices, output_state_indices=output_state_indices,
                disable_state_update=False, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                output=output)


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
    """T >= 1 over a bf16 pool -> gdnjit's ``gated_delta_rule_mtp`` (buffer, FLA scatter, split pool, recovery)."""
    return _run(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                q=q, k=k, v=v, b=b, initial_state_source=initial_state_source,
                initial_state_indices=initial_state_indices, output_state_indices=output_state_indices,
                intermediate_states_buffer=intermediate_states_buffer, ssm_state_indices=ssm_state_indices,
                disable_state_update=disable_state_update, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                scale=scale, output=output, accepted_steps=accepted_steps, recovery_steps=recovery_steps,
                disable_output=disable_output)


def gated_delta_rule_mtp_wide_vec(
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
    tile_v: int = 128,
    disable_output: bool = False,
    recovery_steps: int = 0,
) -> torch.Tensor:
    """FlashInfer's wide-vector variant -> gdnjit's ``gated_delta_rule_mtp``.

    ``tile_v`` (32/64/128) is FlashInfer's tiling choice: checked, then not used (gdnjit picks
    its own kernel variant). As documented for this variant, a given ``intermediate_states_buffer``
    replaces the final pool writeback (the final state is ``buffer[:, T-1]``).
    """
    assert tile_v in (32, 64, 128), f"tile_v must be 32/64/128, got {tile_v}"
    frozen = bool(disable_state_update) or intermediate_states_buffer is not None
    return _run(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                q=q, k=k, v=v, b=b, initial_state_source=initial_state_source,
                initial_state_indices=initial_state_indices, output_state_indices=output_state_indices,
                intermediate_states_buffer=intermediate_states_buffer, ssm_state_indices=ssm_state_indices,
                disable_state_update=frozen, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                output=output, accepted_steps=accepted_steps, recovery_steps=recovery_steps,
                disable_output=disable_output)
