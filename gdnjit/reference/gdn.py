"""Torch reference of the gated delta rule step (docs/design.md section 4), any precision.

Vectorised over batch rows and heads, a loop over tokens. It mirrors the kernels' contract
exactly (pools, split pools, padding rows, negative write indices, intermediate buffers,
per-token pool writes, disable_state_update, both layouts) so GPU tests can compare the whole
observable result: output, every pool slot, and the intermediate buffer.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class GdnReferenceResult:
    output: torch.Tensor            # [B, T, HV, V] in the compute dtype; padding rows are 0
    state: torch.Tensor             # the state/pool after the call, in the state's dtype (a new tensor)
    intermediate: torch.Tensor | None  # the intermediate buffer after the call (new tensor), if given


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
          softplus_beta: float = 1.0, softplus_threshold: float = 20.0, dtype=torch.float64):
    """(g, beta) of shape [B, T, HV]: decay multiplier exp(-exp(A_log) * softplus(a + dt_bias)) and sigmoid(b)."""
    x = a.to(dtype) + dt_bias.to(dtype)
    bx = softplus_beta * x
    sp = torch.where(bx > softplus_threshold, x, torch.log1p(torch.exp(bx)) / softplus_beta)
    g = torch.exp(-torch.exp(A_log.to(dtype)) * sp)
    return g, torch.sigmoid(b.to(dtype))


def gdn_reference(q, k, v, A_log, a, dt_bias, b, state, *, layout: str = "klast", scale: float | None = None,
                  use_qk_l2norm: bool = True, read_indices=None, write_indices=None, intermediate=None,
                  ssm_state_indices=None, disable_state_update: bool = False, softplus_beta: float = 1.0,
                  softplus_threshold: float = 20.0, dtype=torch.float64) -> GdnReferenceResult:
    """Compute one GDN call.

    q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``; a, b ``[B,T,HV]``; A_log, dt_bias ``[HV]``.
    ``state``: ``[N, HV, V, K]`` (layout ``klast``) or ``[N, HV, K, V]`` (``kmajor``); without
    ``read_indices`` row n uses slot n (direct state, N == B). ``read_indices[n] < 0``: padding
    row (output 0, nothing read or written). ``write_indices`` (default: read slot): negative
    skips the final writeback. ``intermediate`` ``[B, cache_steps, HV, (state layout)]`` receives the
    state after each token. ``ssm_state_indices [B, T]`` writes the state after token t to that
    slot (negative: skipped) instead of the final writeback (with ``write_indices`` as well: FlashInfer's split
    pool, the final state also goes to ``write_indices[n]``). ``disable_state_update``: no pool writes.
    """
    if layout not in ("klast", "kmajor"):
        raise ValueError(f"layout: expected 'klast' or 'kmajor', got {layout!r}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    new_state = state.clone()
    inter = intermediate.clone() if intermediate is not None else None
    out = torch.zeros(B, T, HV, V, dtype=dtype, device=q.device)
    g, beta = gates(a, b, A_log, dt_bias, softplus_beta, softplus_threshold, dtype)
    rep = HV // H
    qe = q.to(dtype).repeat_interleave(rep, dim=2)  # [B,T,HV,K]
    ke = k.to(dtype).repeat_interleave(rep, dim=2)
    if use_qk_l2norm:
        qe = qe * torch.rsqrt((qe * qe).sum(-1, keepdim=True) + 1e-6)
        ke = ke * torch.rsqrt((ke * ke).sum(-1, keepdim=True) + 1e-6)
    qe = qe * scale
    ve = v.to(dtype)

    def as_vk(s):  # stored layout -> [.., V, K]
        return s if layout == "klast" else s.transpose(-1, -2)

    def as_stored(s):
        return s if layout == "klast" else s.transpose(-1, -2)

    # All rows at once: gather each row's slot (padding rows read slot 0 and are masked out).
    read = torch.arange(B, device=q.device) if read_indices is None else read_indices.to(q.device).long()
    live = read >= 0
    S = as_vk(state[read.clamp(min=0)].to(dtype))  # [B, HV, V, K]
    ssm_writes = []
    for t in range(T):
        S = S * g[:, t, :, None, None]
        kv = torch.einsum("bhvk,bhk->bhv", S, ke[:, t])
        u = (ve[:, t] - kv) * beta[:, t, :, None]
        S = S + u[..., None] * ke[:, t, :, None, :]
        out[:, t] = torch.einsum("bhvk,bhk->bhv", S, qe[:, t]) * live[:, None, None]
        if inter is not None:
            inter[:B, t][live] = as_stored(S[live]).to(inter.dtype)
        if ssm_state_indices is not None and not disable_state_update:
            ssm_writes.append(S)
    if disable_state_update:
        return GdnReferenceResult(out, new_state, inter)
    # Writes in row order (tests keep destination slots distinct; kernels give no order between rows).
    for n in range(B):
        if not bool(live[n]):
            continue
        if ssm_state_indices is not None:
            for t in range(T):
                slot = int(ssm_state_indices[n, t])
                if slot >= 0:
                    new_state[slot] = as_stored(ssm_writes[t][n]).to(new_state.dtype)
            if write_indices is None:  # same pool: the per-token writes replace the final writeback
                continue
        w = int(read[n]) if write_indices is None else int(write_indices[n])
        if w >= 0:
            new_state[w] = as_stored(S[n]).to(new_state.dtype)
    return GdnReferenceResult(out, new_state, inter)
