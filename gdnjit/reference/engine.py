"""Torch reference of :func:`gdnjit.gdn_engine.engine_step` (the engines' conventions: varlen tokens, accepted-count
reads, per-token slot writes, indexed / by-token buffers, trees, null slots, zero-state padding), any precision.

A loop over requests and tokens (tests and CPU tracing only). Returns new tensors; nothing is mutated. Reads
come from the pool as passed (every request's read precedes every write, as in the kernel when no two requests
share a slot), writes are rounded to the pool / buffer dtype, the running state stays in ``dtype``.
"""

from __future__ import annotations

import dataclasses

import torch

from .gdn import gates as _gates


@dataclasses.dataclass
class EngineReferenceResult:
    output: torch.Tensor               # [*q.shape[:2], HV, V] in the compute dtype; skipped requests' rows 0
    state: torch.Tensor                # the pool after the call (a new tensor, the pool's dtype)
    intermediate: torch.Tensor | None  # the intermediate buffer after the call, if given
    skipped: torch.Tensor              # bool [*q.shape[:2]]: token rows of requests nothing was computed for
    replay_cache: tuple | None         # the ReplaySSM caches (rawv, rawk, g, beta) after the call, if given


def engine_reference(q, k, v, A_log, a, dt_bias, b, state, *, T: int, read_idx, cu_seqlens=None,
                     num_accepted=None, ssm_idx=None, inter=None, inter_idx=None, parent=None, bounded: bool = False,
                     update: bool = True, null_slot: str = "negative", padding: str = "skip", gates: str = "raw",
                     scale=None, l2norm: bool = True, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
                     replay_cache=None, round_beta: bool = False, dtype=torch.float64) -> EngineReferenceResult:
    """Same arguments as :func:`gdnjit.gdn_engine.engine_step` (``T`` unused but accepted alike); ``output``
    ``[*q.shape[:2], HV, V]`` in ``dtype`` (zeros for skipped requests' and unused rows); ``replay_cache`` (the
    ReplaySSM caches, ``[slots, heads, L, ..]``) receives each computed token's raw v / k, log decay and beta at the
    read slot, position t < L (t counted inside the request); ``round_beta``: beta rounded to q's dtype first."""
    del T, bounded  # bounds the kernel enforces (a trap); the reference computes any length
    lead, H, K = tuple(q.shape[:2]), q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    dev = torch.device("cpu")
    f = lambda x: None if x is None else x.detach().to(dev)  # noqa: E731
    q, k, v, a, b, state, read_idx, cu_seqlens, num_accepted, ssm_idx, inter, inter_idx, parent = map(
        f, (q, k, v, a, b, state, read_idx, cu_seqlens, num_accepted, ssm_idx, inter, inter_idx, parent))
    if gates == "raw":
        g_all, beta_all = _gates(a, b, f(A_log), f(dt_bias), softplus_beta, softplus_threshold, dtype)
        if round_beta:  # SGLang's packed decode: beta rounded to the input dtype before use
            beta_all = beta_all.to(q.dtype).to(dtype)
    else:
        g_all, beta_all = torch.exp(a.to(dtype)), b.to(dtype)
    out = torch.zeros((*lead, HV, V), dtype=dtype)
    new_state = state.clone()
    new_inter = None if inter is None else inter.clone()
    caches = None if replay_cache is None else [f(c).clone() for c in replay_cache]
    skipped = torch.zeros(lead, dtype=torch.bool)
    min_slot = 1 if null_slot == "nonpositive" else 0
    varlen = cu_seqlens is not None
    N = cu_seqlens.numel() - 1 if varlen else lead[0]
    rep = HV // H
    for n in range(N):
        if varlen:
            row, bos, length = 0, int(cu_seqlens[n]), int(cu_seqlens[n + 1]) - int(cu_seqlens[n])
        else:
            row, bos, length = n, 0, lead[1]
        if length <= 0:
            continue
        if num_accepted is not None:
            slot = int(read_idx[n, int(num_accepted[n]) - 1])
        else:
            slot = int(read_idx[n])
        pad = slot < min_slot
        if pad and padding == "skip":
            skipped[row, bos:bos + length] = True
            continue
        S = torch.zeros((HV, V, K), dtype=dtype) if pad else state[slot].to(dtype)
        if inter is None:
            irow = None
        elif inter_idx is not None:
            irow = int(inter_idx[n])
        else:
            irow = bos if varlen else n
        by_token = inter is not None and inter_idx is None and varlen
        for t in range(length):
            tok = bos + t
            if parent is not None and t > 0 and irow is not None and irow >= 0:
                S = new_inter[irow, int(parent[n, t])].to(dtype)
            qt, kt = q[row, tok].to(dtype), k[row, tok].to(dtype)  # [H, K]
            if l2norm:
                qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6)
                kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
            qt = (qt * scale).repeat_interleave(rep, 0)
            kt = kt.repeat_interleave(rep, 0)  # [HV, K]
            g = g_all[row, tok].view(HV, 1, 1)
            beta = beta_all[row, tok].view(HV, 1)
            if caches is not None and not pad and t < caches[0].shape[2]:  # ReplaySSM: raw inputs at the read slot
                caches[0][slot, :, t] = v[row, tok].to(caches[0].dtype)
                caches[1][slot, :, t] = k[row, tok].to(caches[1].dtype)
                caches[2][slot, :, t] = torch.log(g.view(HV)).to(caches[2].dtype)
                caches[3][slot, :, t] = beta.view(HV).to(caches[3].dtype)
            S = S * g
            u = (v[row, tok].to(dtype) - torch.einsum("hvk,hk->hv", S, kt)) * beta
            S = S + u.unsqueeze(-1) * kt.unsqueeze(1)
            out[row, tok] = torch.einsum("hvk,hk->hv", S, qt)
            if irow is not None and irow >= 0:
                if by_token:
                    new_inter[irow + t, 0] = S.to(new_inter.dtype)
                else:
                    new_inter[irow, t] = S.to(new_inter.dtype)
            if ssm_idx is not None:
                dst = int(ssm_idx[n, t])
                if dst >= min_slot:
                    new_state[dst] = S.to(new_state.dtype)
        if update and ssm_idx is None and not pad:
            new_state[slot] = S.to(new_state.dtype)
    return EngineReferenceResult(out, new_state, new_inter, skipped, None if caches is None else tuple(caches))
