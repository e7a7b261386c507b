"""Torch reference of gdnjit's fused speculative step (:mod:`gdnjit.spec_step`), any precision.

Per request n with checkpoint slot ``s = state_indices[n]`` (padding: ``s <= null_block_id``, nothing read or
written, output rows 0) and cache half ``h = ctl[s, 0] & 1``:

1. replay the first ``num_accepted[n]`` tokens the previous step cached in half h of slot s (raw k, v, log decay g,
   beta) into the checkpoint: ``S = exp(g) S; u = (v - S k^) beta; S = S + u k^T`` with ``k^ = l2norm(k)``;
2. when anything was replayed, store S as the new checkpoint (rounded to the state's dtype) and continue from the
   stored value;
3. (a step, not a flush) run the T new tokens from it as a verify (outputs, no state write; the gated delta rule of
   :mod:`gdnjit.reference.gdn`), cache each one's raw k, v, log decay and beta in half ``1 - h``, and flip
   ``ctl[s, 0]``.
"""

from __future__ import annotations

import dataclasses

import torch

from .gdn import gates as _gates


@dataclasses.dataclass
class SpecStepReferenceResult:
    output: torch.Tensor | None  # [B, T, HV, V] in the compute dtype (padding rows 0); None for a flush
    state: torch.Tensor          # the pool after the call (a new tensor, the pool's dtype)
    cache: tuple                 # (k, v, g, beta, ctl) after the call (new tensors)


def spec_step_reference(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache, *,
                        scale: float | None = None, use_qk_l2norm: bool = True, softplus_beta: float = 1.0,
                        softplus_threshold: float = 20.0, null_block_id: int = -1, flush: bool = False,
                        dtype=torch.float64) -> SpecStepReferenceResult:
    """The fused step (``flush``: only its replay; q, k, v, A_log, a, dt_bias, b unused and may be None).

    Shapes as :func:`gdnjit.gated_delta_rule_spec_step`: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, a, b
    ``[B, T, HV]``; state ``[slots, HV, V, K]``; ``cache = (k [slots, 2, H, T, K], v [slots, 2, HV, T, V],
    g [slots, 2, HV, T], beta [slots, 2, HV, T], ctl [slots, 2] int32)``.
    """
    ck, cv, cg, cb, ctl = (x.detach().cpu().clone() for x in cache)
    new_state = state.detach().cpu().clone()
    H, T_c, K = ck.shape[2], ck.shape[3], ck.shape[4]
    HV, V = cv.shape[2], cv.shape[4]
    rep = HV // H
    idx = state_indices.detach().cpu()
    acc_all = num_accepted.detach().cpu()
    out = None
    if not flush:
        q, k, v, a, b = (x.detach().cpu() for x in (q, k, v, a, b))
        B, T = q.shape[0], q.shape[1]
        scale = K ** -0.5 if scale is None else scale
        out = torch.zeros(B, T, HV, V, dtype=dtype)
        g_all, beta_all = _gates(a, b, A_log.detach().cpu(), dt_bias.detach().cpu(), softplus_beta,
                                 softplus_threshold, dtype)

    def norm(x):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) if use_qk_l2norm else x

    for n in range(idx.shape[0]):
        slot, acc = int(idx[n]), int(acc_all[n])
        if slot <= null_block_id:
            continue
        if not 0 <= acc <= T_c:
            raise ValueError(f"num_accepted: expected 0..{T_c}, got {acc} for row {n}")
        half = int(ctl[slot, 0]) & 1
        S = new_state[slot].to(dtype)  # [HV, V, K]
        kk = norm(ck[slot, half].to(dtype).repeat_interleave(rep, dim=0))  # [HV, T, K]
        for t in range(acc):
            S = S * torch.exp(cg[slot, half, :, t].to(dtype))[:, None, None]
            u = (cv[slot, half, :, t].to(dtype) - torch.einsum("hvk,hk->hv", S, kk[:, t])) * cb[slot, half, :, t, None]
            S = S + u[..., None] * kk[:, t, None, :]
        if acc > 0:
            new_state[slot] = S.to(new_state.dtype)
            S = new_state[slot].to(dtype)
        if flush:
            continue
        qn = norm(q[n].to(dtype).repeat_interleave(rep, dim=1)) * scale  # [T, HV, K]
        kn = norm(k[n].to(dtype).repeat_interleave(rep, dim=1))
        for t in range(T):
            S = S * g_all[n, t][:, None, None]
            u = (v[n, t].to(dtype) - torch.einsum("hvk,hk->hv", S, kn[t])) * beta_all[n, t][:, None]
            S = S + u[..., None] * kn[t, :, None, :]
            out[n, t] = torch.einsum("hvk,hk->hv", S, qn[t])
        o = half ^ 1
        ck[slot, o, :, :T] = k[n].transpose(0, 1).to(ck.dtype)
        cv[slot, o, :, :T] = v[n].transpose(0, 1).to(cv.dtype)
        cg[slot, o, :, :T] = torch.log(g_all[n]).transpose(0, 1).to(cg.dtype)
        cb[slot, o, :, :T] = beta_all[n].transpose(0, 1).to(cb.dtype)
        ctl[slot, 0] = o
    return SpecStepReferenceResult(out, new_state, (ck, cv, cg, cb, ctl))
