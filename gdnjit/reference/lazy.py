"""Float64 torch reference of the lazy-state gated delta rule (:mod:`gdnjit.lazy`, :mod:`gdnjit.ucache`;
docs/design.md sections 4, 9 and 11).

Two pieces:

- :func:`sequential_decode`: the ground truth, plain per-token GDN (section 4) over a token stream from an initial
  state (:func:`gdnjit.reference.gdn.gdn_reference` on a direct state, optionally rounding the state to a storage
  dtype after every token, which models a plain decode over a bf16 / fp16 pool).
- :class:`LazyModel`: a pure torch model of a slot pool with its lazy rings and cursors. It keeps what the kernels
  keep (the checkpoint pool S0, per slot a ring of 32 (or 16) rows of normalised key, correction u and cumulative log
  decay G since the checkpoint, the ``[len, base, pending, arrive]`` cursor) and applies gdnjit's rules to them:
  :meth:`LazyModel.step` / :meth:`LazyModel.fold` / :meth:`LazyModel.reset` (gdnjit's own per-slot cursors: accepted
  counts, pending rows, folds when ``P + T > window``, the base sliding on a fold, the new rows' G re-based to the
  folded checkpoint) and :meth:`LazyModel.ucache_step` with :func:`ucache_commit` (FlashInfer's caller-owned
  ``hist_len`` / ``cache_base`` cursors). After every call its ``state``, ``k``, ``u``, ``g`` and ``cursor`` are the
  expected contents of the kernel's pool, rings and cursors (rows outside a slot's live window are unspecified).

Per (slot, value head), the committed window rows j < P and the step's new tokens t (docs/design.md section 11):
``u_t = beta_t (v_t - e^{G_t} S0 k^_t - sum_{j<t} e^{G_t - G_j} u_j (k^_j . k^_t))``,
``o_t = e^{G_t} S0 q^_t + sum_{j<=t} e^{G_t - G_j} u_j (k^_j . q^_t)`` and a fold
``S0 <- e^{G_P} S0 + sum_{j<P} e^{G_P - G_j} u_j k^_j^T``.

Rounding points (``state_dtype`` / ``ring_dtype`` given, else none, exact float64): the kernels keep the step's own new
rows in fp32 registers but store ring rows (normalised k, u) rounded to the ring dtype, so a later step (and a fold)
reads the rounded rows; a fold rounds the new checkpoint to the state dtype once. Inputs (q, k, v, a, b, A_log,
dt_bias) are used as given, i.e. already in their storage dtype. G stays float64 here (fp32 in the kernel).
"""

from __future__ import annotations

from typing import Optional

import torch

from .gdn import gdn_reference

F64 = torch.float64


def log_decay(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, softplus_beta: float = 1.0,
              softplus_threshold: float = 20.0, dtype=F64) -> torch.Tensor:
    """The log of the section-4 decay multiplier, ``-exp(A_log) * softplus(a + dt_bias)``, shape of ``a``
    (``[..., HV]``), computed directly (never ``log(exp(.))``: a strong decay does not underflow to -inf)."""
    x = a.to(dtype) + dt_bias.to(dtype)
    bx = softplus_beta * x
    sp = torch.where(bx > softplus_threshold, x, torch.log1p(torch.exp(bx)) / softplus_beta)
    return -torch.exp(A_log.to(dtype)) * sp


def normalize(x: torch.Tensor, use_qk_l2norm: bool = True, dtype=F64) -> torch.Tensor:
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the last dim (``use_qk_l2norm``), else ``x``, in ``dtype``."""
    x = x.to(dtype)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) if use_qk_l2norm else x


def sequential_decode(q, k, v, A_log, a, dt_bias, b, state, *, scale: Optional[float] = None,
                      use_qk_l2norm: bool = True, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
                      state_dtype: Optional[torch.dtype] = None, dtype=F64) -> tuple:
    """Plain sequential GDN decoding (docs/design.md section 4) of B independent token streams of N tokens.

    q, k ``[B, N, H, K]``; v ``[B, N, HV, V]``; a, b ``[B, N, HV]``; A_log, dt_bias ``[HV]``; ``state [B, HV, V, K]``
    (K-last), the state before the first token. Returns ``(out [B, N, HV, V], final state [B, HV, V, K])`` in
    ``dtype``. ``state_dtype``: round the state to it after every token (a plain decode over a pool of that dtype;
    the initial state is rounded too); None: no rounding.
    """
    S = state.detach().to(dtype)
    if state_dtype is None:
        r = gdn_reference(q, k, v, A_log, a, dt_bias, b, S, scale=scale, use_qk_l2norm=use_qk_l2norm,
                          softplus_beta=softplus_beta, softplus_threshold=softplus_threshold, dtype=dtype)
        return r.output, r.state
    S = S.to(state_dtype).to(dtype)
    outs = []
    for t in range(q.shape[1]):
        sl = slice(t, t + 1)
        r = gdn_reference(q[:, sl], k[:, sl], v[:, sl], A_log, a[:, sl], dt_bias, b[:, sl], S, scale=scale,
                          use_qk_l2norm=use_qk_l2norm, softplus_beta=softplus_beta,
                          softplus_threshold=softplus_threshold, dtype=dtype)
        outs.append(r.output)
        S = r.state.to(state_dtype).to(dtype)
    return torch.cat(outs, 1) if outs else torch.zeros(*v.shape, dtype=dtype, device=v.device), S


def ucache_commit(hist_len: torch.Tensor, cache_base: torch.Tensor, flush_min: int, ring: int = 32) -> tuple:
    """FlashInfer's in-place cursor commit of ``gated_delta_rule_mtp_ucache_flush(restart_hist_on_flush=True)``, as
    new tensors: rows with ``hist_len >= flush_min`` (folded) get ``cache_base <- (cache_base + hist_len) mod ring``
    and ``hist_len <- 0``; the others keep theirs. (Every such row, padding rows included, as FlashInfer does.)"""
    folded = hist_len >= flush_min
    base = torch.where(folded, (cache_base + hist_len) & (ring - 1), cache_base)
    return hist_len.masked_fill(folded, 0), base


class LazyModel:
    """A float64 model of a lazy slot pool: checkpoints, rings and cursors, and the calls that change them.

    Attributes (the expected kernel-side contents, on the initial state's device):
        state: ``[slots, HV, V, K]`` the checkpoint pool (values rounded to ``state_dtype`` where given).
        k: ``[slots, H, ring, K]`` normalised keys; u: ``[slots, HV, ring, V]`` corrections (both rounded to
            ``ring_dtype`` where given); g: ``[slots, HV, ring]`` cumulative log decay since the checkpoint.
        cursor: ``[slots, 4]`` int32 on the CPU: committed length, base row, pending rows, arrival count (always 0
            between calls).

    Args:
        state: the initial checkpoint pool ``[slots, HV, V, K]`` (any dtype; copied).
        H: the q / k heads (HV a multiple of H).
        ring: physical ring rows (32: gdnjit's own calls and FlashInfer's flush call; 16: FlashInfer's verify-only
            call's flat ring).
        window: the committed rows a slot keeps before a step folds (gdnjit's ``window`` tunable, 16 by default):
            a step folds when ``P + T > window``; 0 is the eager form's (plain steps of one token): every step folds
            its P rows and its own token, from their unrounded values, and leaves the ring empty (the attribute may
            be changed between calls, as the dispatcher's choice changes with the batch).
        state_dtype, ring_dtype: apply the kernels' rounding points (module docstring); None: exact.
        dtype: the compute dtype (float64).
    """

    def __init__(self, state: torch.Tensor, H: int, *, ring: int = 32, window: int = 16,
                 state_dtype: Optional[torch.dtype] = None, ring_dtype: Optional[torch.dtype] = None, dtype=F64):
        if ring not in (16, 32):
            raise ValueError(f"ring: expected 16 or 32 rows, got {ring}")
        slots, HV, V, K = state.shape
        if H < 1 or HV % H:
            raise ValueError(f"H: expected a divisor of HV={HV}, got {H}")
        self.H, self.HV, self.K, self.V, self.slots = H, HV, K, V, slots
        self.ring, self.window, self.dtype = ring, window, dtype
        self.state_dtype, self.ring_dtype = state_dtype, ring_dtype
        self.device = state.device
        self.state = self._round(state.detach().to(dtype).clone(), state_dtype)
        self.k = torch.zeros(slots, H, ring, K, dtype=dtype, device=self.device)
        self.u = torch.zeros(slots, HV, ring, V, dtype=dtype, device=self.device)
        self.g = torch.zeros(slots, HV, ring, dtype=dtype, device=self.device)
        self.cursor = torch.zeros(slots, 4, dtype=torch.int32)

    @classmethod
    def from_cache(cls, state: torch.Tensor, cache, *, rounding: bool = True, window: int = 16,
                   device=None, dtype=F64) -> "LazyModel":
        """A model holding copies of a kernel-side pool and :class:`gdnjit.LazyCache` (or any ``(k, u, g, cursor)``
        tuple; without a cursor pass ``(k, u, g, None)``: cursors zero). ``rounding``: use the pool's and the ring's
        dtypes as the rounding points. ``device``: where the model computes (default: the state's device)."""
        k, u, g, cursor = cache
        m = cls(state.to(device) if device is not None else state, k.shape[1], ring=k.shape[2], window=window,
                state_dtype=state.dtype if rounding else None, ring_dtype=k.dtype if rounding else None, dtype=dtype)
        m.k.copy_(k.detach().to(m.device, dtype))
        m.u.copy_(u.detach().to(m.device, dtype))
        m.g.copy_(g.detach().to(m.device, dtype))
        if cursor is not None:
            m.cursor.copy_(cursor.detach().cpu())
        return m

    # ---- helpers --------------------------------------------------------------------------------------------

    @staticmethod
    def _round(x: torch.Tensor, dt: Optional[torch.dtype]) -> torch.Tensor:
        return x if dt is None else x.to(dt).to(x.dtype)

    def _live(self, slot: int, null_block_id: int) -> bool:
        if slot < 0 or slot <= null_block_id:
            return False
        if slot >= self.slots:
            raise IndexError(f"slot {slot} is past the pool's {self.slots} slots (the kernel traps)")
        return True

    def rows(self, slot: int, start: int, count: int, base: Optional[int] = None) -> list:
        """Physical ring rows of logical rows ``start .. start + count - 1`` of ``slot`` (from its cursor's base,
        or ``base``)."""
        b = int(self.cursor[slot, 1]) if base is None else base
        return [(b + j) & (self.ring - 1) for j in range(start, start + count)]

    def live_rows(self, slot: int) -> list:
        """The physical ring rows a slot's cursor says hold data: its committed rows, then its pending rows."""
        n, _, pend, _ = (int(x) for x in self.cursor[slot])
        return self.rows(slot, 0, n + pend)

    def current_state(self, slots=None) -> torch.Tensor:
        """The exact current state of each slot (all slots, or the list ``slots``): its checkpoint with its committed
        rows folded in (``[n, HV, V, K]``, not rounded; pending rows excluded). Changes nothing."""
        slots = range(self.slots) if slots is None else slots
        out = []
        for s in slots:
            n = int(self.cursor[s, 0])
            out.append(self._fold_value(s, self.rows(s, 0, n)))
        return torch.stack(out) if out else self.state[:0].clone()

    def _fold_value(self, slot: int, rows: list) -> torch.Tensor:
        S0 = self.state[slot]
        if not rows:
            return S0.clone()
        rep = self.HV // self.H
        kw = self.k[slot][:, rows].repeat_interleave(rep, 0)  # [HV, P, K]
        uw = self.u[slot][:, rows]                             # [HV, P, V]
        gw = self.g[slot][:, rows]                             # [HV, P]
        gP = gw[:, -1:]
        d = torch.exp(gP - gw)                                 # [HV, P]
        return torch.exp(gP)[:, :, None] * S0 + torch.einsum("hp,hpv,hpk->hvk", d, uw, kw)

    def _tokens(self, q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm, softplus_beta, softplus_threshold):
        dev, dt = self.device, self.dtype
        K = q.shape[-1]
        scale = K ** -0.5 if scale is None else scale
        qn = normalize(q.detach().to(dev), use_qk_l2norm, dt) * scale
        kn = normalize(k.detach().to(dev), use_qk_l2norm, dt)
        lg = log_decay(a.detach().to(dev), A_log.detach().to(dev), dt_bias.detach().to(dev), softplus_beta,
                       softplus_threshold, dt)
        beta = torch.sigmoid(b.detach().to(dev, dt))
        return qn, kn, v.detach().to(dev, dt), lg, beta

    def _run(self, slot: int, P: int, base: int, fold: bool, qn, kn, v, lg, beta) -> torch.Tensor:
        """One row's step on ``slot`` with P committed rows from ring row ``base``: outputs ``[T, HV, V]``, the T new
        rows appended at ``(base + P + t) mod ring`` (G re-based when it folds), the fold of the P rows."""
        if not 0 <= P <= 16:
            raise ValueError(f"slot {slot}: {P} committed rows, the kernels read at most 16")
        T = qn.shape[0]
        rep, mask = self.HV // self.H, self.ring - 1
        win = self.rows(slot, 0, P, base)
        S0 = self.state[slot]                                        # [HV, V, K]
        keys = self.k[slot][:, win].repeat_interleave(rep, 0)        # [HV, P, K] (copies: the appends cannot alias)
        us = self.u[slot][:, win]                                    # [HV, P, V]
        gs = self.g[slot][:, win]                                    # [HV, P]
        g0 = gs[:, -1] if P else torch.zeros(self.HV, dtype=self.dtype, device=self.device)
        Gn = g0[None, :] + torch.cumsum(lg, 0)                       # [T, HV]
        kh = kn.repeat_interleave(rep, 1)                            # [T, HV, K]
        qh = qn.repeat_interleave(rep, 1)
        out = torch.empty(T, self.HV, self.V, dtype=self.dtype, device=self.device)
        new_u = []
        for t in range(T):
            e = torch.exp(Gn[t])                                     # [HV]
            w = torch.exp(Gn[t][:, None] - gs)                       # [HV, m] rows before t
            kk = e[:, None] * torch.einsum("hvk,hk->hv", S0, kh[t]) + \
                torch.einsum("hm,hmv->hv", w * torch.einsum("hmk,hk->hm", keys, kh[t]), us)
            u = beta[t][:, None] * (v[t] - kk)                       # [HV, V]
            new_u.append(u)
            keys = torch.cat([keys, kh[t][:, None]], 1)
            us = torch.cat([us, u[:, None]], 1)
            gs = torch.cat([gs, Gn[t][:, None]], 1)
            w = torch.exp(Gn[t][:, None] - gs)
            out[t] = e[:, None] * torch.einsum("hvk,hk->hv", S0, qh[t]) + \
                torch.einsum("hm,hmv->hv", w * torch.einsum("hmk,hk->hm", keys, qh[t]), us)
        if self.window == 0:  # eager: the window and the new rows folded at once (the new rows never rounded)
            gl = gs[:, -1]
            S = torch.exp(gl)[:, None, None] * S0 + torch.einsum("hp,hpv,hpk->hvk", torch.exp(gl[:, None] - gs), us,
                                                                 keys)
            self.state[slot] = self._round(S, self.state_dtype)
            return out
        if fold and P > 0:
            new_state = self._round(self._fold_value(slot, win), self.state_dtype)  # before the appends
            shift = g0
        else:
            new_state, shift = None, torch.zeros_like(g0)
        for t in range(T):
            r = (base + P + t) & mask
            self.k[slot][:, r] = self._round(kn[t], self.ring_dtype)
            self.u[slot][:, r] = self._round(new_u[t], self.ring_dtype)
            self.g[slot][:, r] = Gn[t] - shift
        if new_state is not None:
            self.state[slot] = new_state
        return out

    # ---- gdnjit's calls ---------------------------------------------------------------------------------------

    def step(self, q, k, v, A_log, a, dt_bias, b, state_indices, num_accepted=None, *, scale: Optional[float] = None,
             use_qk_l2norm: bool = True, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
             null_block_id: int = -1) -> torch.Tensor:
        """:func:`gdnjit.gated_delta_rule_lazy_step`: returns the outputs ``[B, T, HV, V]`` (padding rows 0).

        Per live row n on slot s: ``P = len + clamp(num_accepted[n], 0, pending)`` (None: 0); the outputs from the
        checkpoint and the P rows; a fold when ``P + T > window``; the T rows appended past the window (window 0:
        the P rows and the token folded, ring emptied: cursor ``[0, base + P, 0, 0]``). Cursor after:
        plain (``num_accepted`` None) ``len = (0 if folded else P) + T``, pending 0; speculative ``len = (0 if folded
        else P)``, pending T; a fold slides the base by P."""
        B, T = q.shape[0], q.shape[1]
        qn, kn, vv, lg, beta = self._tokens(q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm, softplus_beta,
                                            softplus_threshold)
        out = torch.zeros(B, T, self.HV, self.V, dtype=self.dtype, device=self.device)
        idx = [int(x) for x in state_indices.detach().cpu().tolist()]
        acc = None if num_accepted is None else [int(x) for x in num_accepted.detach().cpu().tolist()]
        if self.window == 0 and (acc is not None or T != 1):
            raise ValueError("window 0 (the eager form) takes plain steps of one token")
        for n, s in enumerate(idx):
            if not self._live(s, null_block_id):
                continue
            ln, base, pend, _ = (int(x) for x in self.cursor[s])
            P = ln + (0 if acc is None else min(max(acc[n], 0), pend))
            fold = P + T > self.window
            out[n] = self._run(s, P, base, fold, qn[n], kn[n], vv[n], lg[n], beta[n])
            if self.window == 0:  # eager: an empty ring, its base past the folded rows
                self.cursor[s] = torch.tensor([0, (base + P) & (self.ring - 1), 0, 0], dtype=torch.int32)
                continue
            ln = 0 if fold else P
            if fold:
                base = (base + P) & (self.ring - 1)
            if acc is None:
                self.cursor[s] = torch.tensor([ln + T, base, 0, 0], dtype=torch.int32)
            else:
                self.cursor[s] = torch.tensor([ln, base, T, 0], dtype=torch.int32)
        return out

    def fold(self, state_indices, num_accepted=None, *, null_block_id: int = -1) -> None:
        """:func:`gdnjit.gated_delta_rule_lazy_fold`: commit ``clamp(num_accepted[n], 0, pending)`` pending rows
        (None: 0), fold the P committed rows into the checkpoint (rounded to the state dtype; nothing when P = 0),
        slide the base by P, empty the ring (len 0, pending 0)."""
        idx = [int(x) for x in state_indices.detach().cpu().tolist()]
        acc = None if num_accepted is None else [int(x) for x in num_accepted.detach().cpu().tolist()]
        for n, s in enumerate(idx):
            if not self._live(s, null_block_id):
                continue
            ln, base, pend, _ = (int(x) for x in self.cursor[s])
            P = ln + (0 if acc is None else min(max(acc[n], 0), pend))
            if P > 16:
                raise ValueError(f"slot {s}: {P} committed rows, the kernels read at most 16")
            if P > 0:
                self.state[s] = self._round(self._fold_value(s, self.rows(s, 0, P)), self.state_dtype)
            self.cursor[s] = torch.tensor([0, (base + P) & (self.ring - 1), 0, 0], dtype=torch.int32)

    def reset(self, state_indices, *, null_block_id: int = -1) -> None:
        """:func:`gdnjit.gated_delta_rule_lazy_reset`: empty the chosen slots' rings (len 0, pending 0; the base and
        the checkpoint stay)."""
        for s in (int(x) for x in state_indices.detach().cpu().tolist()):
            if self._live(s, null_block_id):
                self.cursor[s, 0] = 0
                self.cursor[s, 2] = 0

    # ---- FlashInfer's u-cache calls (caller-owned cursors) ------------------------------------------------------

    def ucache_step(self, q, k, v, A_log, a, dt_bias, b, state_indices, hist_len, cache_base=None, *,
                    flush_min: Optional[int] = None, scale: Optional[float] = None, use_qk_l2norm: bool = True,
                    softplus_beta: float = 1.0, softplus_threshold: float = 20.0) -> torch.Tensor:
        """FlashInfer's u-cache step (:mod:`gdnjit.ucache`): per row, P = ``hist_len[n]`` (0..16) rows from ring row
        ``cache_base[n]`` (None: 0); the outputs; the T new rows appended at ``(base + P + t) mod ring``; with
        ``flush_min`` (the flush call) rows with ``P >= flush_min`` also fold (new rows' G re-based), None (the
        verify-only call) never. Negative slots are padding (output 0). This model's ``cursor`` is not used; commit
        with :func:`ucache_commit` or as the caller does. Returns ``[B, T, HV, V]``."""
        qn, kn, vv, lg, beta = self._tokens(q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm, softplus_beta,
                                            softplus_threshold)
        B, T = q.shape[0], q.shape[1]
        out = torch.zeros(B, T, self.HV, self.V, dtype=self.dtype, device=self.device)
        idx = [int(x) for x in state_indices.detach().cpu().tolist()]
        hl = [int(x) for x in hist_len.detach().cpu().tolist()]
        cb = [0] * B if cache_base is None else [int(x) for x in cache_base.detach().cpu().tolist()]
        for n, s in enumerate(idx):
            if not self._live(s, -1):
                continue
            P, base = hl[n], cb[n] & (self.ring - 1)
            fold = flush_min is not None and P >= flush_min
            out[n] = self._run(s, P, base, fold, qn[n], kn[n], vv[n], lg[n], beta[n])
        return out

    def ucache_current_state(self, slot: int, hist_len: int, cache_base: int = 0) -> torch.Tensor:
        """The exact current state of ``slot`` under FlashInfer's cursors: the checkpoint with the ``hist_len``
        rows from ``cache_base`` folded in (not rounded). Changes nothing."""
        return self._fold_value(slot, self.rows(slot, 0, hist_len, cache_base))
