"""vLLM's GDN kernels' signatures and semantics, on gdnjit's kernels (vLLM 0.33,
``vllm/third_party/flash_linear_attention/ops/{fused_sigmoid_gating,fused_recurrent}.py``; earlier releases:
``vllm/model_executor/layers/fla/ops/``).

Conventions reproduced: q/k/v ``[B, T, ..]`` or varlen ``[1, total, ..]`` with ``cu_seqlens`` (0-length requests
allowed); the state pool ``[slots, HV, V, K]`` with any slot pitch; ``ssm_state_indices`` 1-D ``[N]`` (one slot per
request, read and written) or 2-D ``[N, S]`` (the state after token t written to column t; with
``num_accepted_tokens`` the initial state read from column ``num_accepted_tokens[n] - 1``, else column 0);
slot 0 is vLLM's null block (``null_slot="nonpositive"``: a request whose read slot is <= 0 is skipped, writes to
slots <= 0 are dropped; pass ``null_slot="negative"`` for releases whose padding slot was -1);
``inplace_final_state=False`` returns every token's state in a new tensor (row = the token's flat index); and
vLLM's default non-speculative decode, ``fused_recurrent_gated_delta_rule_packed_decode`` (q / k / v read from the
conv output's packed rows, outputs into a given ``out``, zeros for null-block requests).
Differences (docs/api.md, "vLLM compat"): skipped requests' outputs are zeros (vLLM leaves them unwritten);
with 1-D indices a varlen request of more than one token stops the kernel (a trap; vLLM's kernel writes its token
t's state to ``indices[n + t]``, another request's slot), and without ``cu_seqlens`` the final state of T tokens is
written to ``indices[n]``; ``ssm_state_indices=None`` and KDA are not provided.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..conv import causal_conv1d_update  # noqa: F401  (vLLM's signature; re-exported)
from ..gdn import MAX_T
from . import common as _c
from .launch import step as _step

__all__ = ["fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule",
           "fused_recurrent_gated_delta_rule_packed_decode", "causal_conv1d_update"]


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, beta: float = 1.0, threshold: float = 20.0, scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None, inplace_final_state: bool = True,
    cu_seqlens: Optional[torch.Tensor] = None, ssm_state_indices: Optional[torch.Tensor] = None,
    num_accepted_tokens: Optional[torch.Tensor] = None, use_qk_l2norm_in_kernel: bool = False, is_kda: bool = False,
    *, null_slot: str = "nonpositive",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fused gate + gated delta rule step: ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus ``beta``,
    ``threshold``), ``beta = sigmoid(b)``, then the recurrence over each request's tokens. Returns ``(o,
    final_state)``: o ``[*q.shape[:2], HV, V]`` of q's dtype; final_state is ``initial_state`` (updated in place) or,
    with ``inplace_final_state=False``, a new ``[B * T, HV, V, K]`` tensor of every token's state."""
    if is_kda:
        raise NotImplementedError("is_kda: KDA (per-channel gates) is not provided by gdnjit")
    if isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(v, torch.Tensor) and v.dim() == 4:
        lead = tuple(q.shape[:2])
        a = _c.gate_view("a", a, lead, q)
        b = _c.gate_view("b", b, lead, q)
    return _call(q, k, v, A_log, a, dt_bias, b, "raw", beta, threshold, scale, initial_state, inplace_final_state,
                 cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, null_slot)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: Optional[torch.Tensor] = None,
    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None, inplace_final_state: bool = True,
    cu_seqlens: Optional[torch.Tensor] = None, ssm_state_indices: Optional[torch.Tensor] = None,
    num_accepted_tokens: Optional[torch.Tensor] = None, use_qk_l2norm_in_kernel: bool = False,
    *, null_slot: str = "nonpositive",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's recurrence with the gates computed outside: ``g`` the log decay (the state is multiplied by
    ``exp(g)``) and ``beta`` the update strength (already through the sigmoid; None: ones), both ``[.., HV]``
    (converted to fp32: a copy when they are not). Head-wise beta (one per value channel) is not provided.
    Everything else as :func:`fused_sigmoid_gating_delta_rule_update`."""
    if not (isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(v, torch.Tensor) and v.dim() == 4):
        raise ValueError("q, v: expected 4-D tensors [B, T, H, K] / [B, T, HV, V]")
    lead, HV = tuple(q.shape[:2]), v.shape[2]
    if isinstance(beta, torch.Tensor) and beta.dim() == v.dim():
        raise NotImplementedError("beta: head-wise beta (one per value channel, [.., HV, V]) is not provided by gdnjit")
    g = _c.gate_view("g", g, lead, q).float()
    beta = (torch.ones((*lead, HV), dtype=torch.float32, device=q.device) if beta is None
            else _c.gate_view("beta", beta, lead, q).float())
    return _call(q, k, v, None, g, None, beta, "given", 1.0, 20.0, scale, initial_state, inplace_final_state,
                 cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, null_slot)


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False, *, null_slot: str = "nonpositive",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's default non-speculative decode (one token per request, q / k / v read straight from the conv output):
    ``mixed_qkv [B, 2 H K + HV V]`` laid out ``[q | k | v]`` (unit last-dim stride, any row stride; H inferred from
    the width), ``a`` / ``b [B, HV]`` (raw gates; softplus beta 1, threshold 20), ``initial_state [slots, HV, V, K]``
    updated in place at ``ssm_state_indices [B]``; ``out [B, 1, HV, V]`` (contiguous) receives the outputs, zeros
    for a request whose slot is <= 0 (vLLM's null block; its state untouched). Returns ``(out, initial_state)``."""
    return _c.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                            use_qk_l2norm_in_kernel, null_slot, round_beta=False)


def _call(q, k, v, A_log, a, dt_bias, b, gates, sp_beta, sp_threshold, scale, initial_state, inplace, cu_seqlens,
          indices, num_accepted, l2norm, null_slot):
    if initial_state is None:
        raise ValueError("initial_state: required (the state pool [slots, HV, V, K]; vLLM's kernels need it too)")
    _c.state_pool("initial_state", initial_state)
    if indices is None:
        raise NotImplementedError("ssm_state_indices: required (without it vLLM's kernels address states by token "
                                  "offset, a path vLLM never calls)")
    if not isinstance(indices, torch.Tensor) or indices.dim() not in (1, 2):
        raise ValueError(f"ssm_state_indices: expected a 1-D [N] or 2-D [N, S] tensor, got "
                         f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace_final_state: expected a bool, got {type(inplace).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError("q: expected a 4-D tensor [B, T, H, K] (varlen: [1, total, H, K])")
    cu = _c.offsets("cu_seqlens", cu_seqlens)
    acc = _c.int32("num_accepted_tokens", num_accepted)
    varlen = cu is not None
    total = q.shape[1]
    N = (cu.shape[0] - 1) if varlen else q.shape[0]
    ssm = read = None
    if indices.dim() == 2:
        S = indices.shape[1]
        T = S if varlen else q.shape[1]
        if not 1 <= T <= MAX_T:
            raise ValueError(f"ssm_state_indices: expected 1..{MAX_T} columns (tokens per request), got shape "
                             f"{tuple(indices.shape)}")
        if S < T:
            raise ValueError(f"ssm_state_indices: expected >= T={T} columns, got shape {tuple(indices.shape)}")
        read = indices if acc is not None else indices[:, 0]
        ssm = indices[:, :T]
    else:
        if acc is not None:
            raise ValueError("num_accepted_tokens: needs a 2-D ssm_state_indices [N, S] (the column to start from)")
        T = 1 if varlen else q.shape[1]  # vLLM's contract: 1-D indices serve one token per request
        read = indices
    scale = _c.scale_of(scale, q.shape[3])
    state, HV, V, K = initial_state, v.shape[2], v.shape[3], q.shape[3]
    if inplace:
        out = _step(q, k, v, A_log, a, dt_bias, b, state, T=T, read_idx=read, cu_seqlens=cu, num_accepted=acc,
                    ssm_idx=ssm, bounded=True, update=True, null_slot=null_slot, padding="skip", gates=gates, scale=scale,
                    l2norm=l2norm, softplus_beta=sp_beta, softplus_threshold=sp_threshold)
        return out, state
    rows = q.shape[0] * q.shape[1]
    final = state.new_empty((rows, HV, V, K))
    inter = final.view(rows, 1, HV, V, K) if varlen else final.view(N, T, HV, V, K)
    out = _step(q, k, v, A_log, a, dt_bias, b, state, T=T, read_idx=read, cu_seqlens=cu, num_accepted=acc,
                inter=inter, bounded=True, update=False, null_slot=null_slot, padding="skip", gates=gates, scale=scale,
                l2norm=l2norm, softplus_beta=sp_beta, softplus_threshold=sp_threshold)
    return out, final
