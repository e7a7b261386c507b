"""Torch reference of replaying cached draft tokens into a checkpoint state (speculative decoding, issue 26).

FlashInfer 0.7.2.post1's ReplaySSM contract (``gated_delta_rule_replayssm_commit``), in float64 or any dtype:
verify caches, per pool slot, each draft token's raw inputs instead of its state; after acceptance, the first
``accept_lens[i]`` cached tokens of request i are replayed into its checkpoint (the only state write). The
recurrence is the one of :mod:`gdnjit.reference.gdn` without the output: per token t, value head hv (key head
``h = hv // (HV // H)``)::

    k^ = l2norm(k[h, t])  (eps 1e-6; raw k without use_qk_l2norm)
    S  = exp(g[hv, t]) * S;  u = (v[hv, t] - S k^) * beta[hv, t];  S = S + u k^T

with ``g`` the log-decay (``-exp(A_log) * softplus(a + dt_bias)``) and ``beta`` the sigmoid of ``b``.
"""

from __future__ import annotations

import torch


def replay_commit_reference(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
                            *, track_state_indices=None, track_steps=None, use_qk_l2norm: bool = True,
                            null_block_id: int = -1, dtype=torch.float64) -> torch.Tensor:
    """The checkpoint after the commit (a new tensor in ``checkpoint_state``'s dtype).

    Shapes (FlashInfer's): ``checkpoint_state [L, slots, HV, V, K]`` (K-last), ``rawv_cache [L, slots, HV, T, V]``,
    ``rawk_cache [L, slots, H, T, K]`` (before l2norm), ``g_cache`` / ``beta_cache [L, slots, HV, T]``;
    ``state_indices`` / ``accept_lens`` ``[B]``: request i replays the first ``accept_lens[i]`` (0..T) tokens
    cached at its slot into that slot's checkpoint, in every layer; a slot ``<= null_block_id`` is skipped.
    ``track_state_indices`` / ``track_steps`` ``[B]``: also save the state after token ``track_steps[i]``
    (zero-based) to slot ``track_state_indices[i]``, when that step is inside the accepted prefix.
    """
    L, _, HV, V, K = checkpoint_state.shape
    H, T = rawk_cache.shape[2], rawk_cache.shape[3]
    if HV % H:
        raise ValueError(f"rawk_cache: H={H} must divide HV={HV}")
    if (track_state_indices is None) != (track_steps is None):
        raise ValueError("track_state_indices and track_steps: pass both or neither")
    out = checkpoint_state.clone()
    rep = HV // H
    for i in range(state_indices.shape[0]):
        slot, n = int(state_indices[i]), int(accept_lens[i])
        if slot <= null_block_id or n == 0:
            continue
        if not 0 < n <= T:
            raise ValueError(f"accept_lens: expected 0..{T}, got {n} for request {i}")
        track = None if track_steps is None else (int(track_steps[i]), int(track_state_indices[i]))
        for layer in range(L):
            S = checkpoint_state[layer, slot].to(dtype)  # [HV, V, K]
            k = rawk_cache[layer, slot].to(dtype).repeat_interleave(rep, dim=0)  # [HV, T, K]
            if use_qk_l2norm:
                k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            v = rawv_cache[layer, slot].to(dtype)  # [HV, T, V]
            decay = torch.exp(g_cache[layer, slot].to(dtype))  # [HV, T]
            beta = beta_cache[layer, slot].to(dtype)
            for t in range(n):
                S = S * decay[:, t, None, None]
                u = (v[:, t] - torch.einsum("hvk,hk->hv", S, k[:, t])) * beta[:, t, None]
                S = S + u[..., None] * k[:, t, None, :]
                if track is not None and track[0] == t and track[1] > null_block_id:
                    out[layer, track[1]] = S.to(out.dtype)
            out[layer, slot] = S.to(out.dtype)
    return out
