"""The lazy-state reference (gdnjit/reference/lazy.py) on the CPU: the float64 LazyModel without rounding is plain
sequential decoding of the accepted token stream (docs/design.md sections 4, 9, 11), whatever the cursors do: plain
and speculative steps with T 1..16, random accept counts (out-of-range ones clamped), folds at every window length
0..16 (in a step when P + T > window, and explicit), resets with fresh checkpoints, requests joining and leaving
(slots chosen at random from a pool with gaps), padding rows (negative, and null blocks 0 and 2), windows 8 and 16,
GQA; FlashInfer's caller-owned u-cache cursors (flush with and without restart_hist_on_flush, predictive flush_min,
the verify-only flat ring); the rounding points."""

from __future__ import annotations

import random

import pytest
import torch

from gdnjit.reference.gdn import gates, gdn_reference
from gdnjit.reference.lazy import LazyModel, log_decay, sequential_decode, ucache_commit

F64 = torch.float64
bf = torch.bfloat16


def _tokens(g, B, T, H, HV, K, V, dt=bf):
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (r(B, T, H, K).to(dt), r(B, T, H, K).to(dt), r(B, T, HV, V).to(dt), r(B, T, HV).to(dt),
            r(B, T, HV).to(dt))


def _gate_params(g, HV):
    # A_log in [-1, 1) (decays from ~0.2 to ~0.9 a token): the state keeps a long memory of the ring rows
    return torch.rand(HV, generator=g, dtype=F64) * 2 - 1, torch.randn(HV, generator=g, dtype=F64) - 1


def _close(x, ref, tol=1e-10):
    err = (x - ref).abs().max().item() if x.numel() else 0.0
    return err <= tol * max(ref.abs().max().item() if ref.numel() else 0.0, 1.0)


def test_log_decay_is_the_log_of_the_gate():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 4, generator=g) * 10
    A_log, dtb = torch.randn(4, generator=g), torch.randn(4, generator=g)
    for beta, thr in ((1.0, 20.0), (0.5, 3.0)):
        ref, _ = gates(a, a, A_log, dtb, beta, thr)
        assert torch.allclose(torch.exp(log_decay(a, A_log, dtb, beta, thr)), ref, rtol=1e-12, atol=0)
    # a decay past float64's range is a finite log, not -inf
    assert torch.isfinite(log_decay(torch.full((1,), 1e4), torch.full((1,), 5.0), torch.zeros(1))).all()


def test_sequential_decode_is_token_by_token_gdn():
    g = torch.Generator().manual_seed(1)
    B, N, H, HV, K, V = 2, 5, 1, 2, 8, 4
    q, k, v, a, b = _tokens(g, B, N, H, HV, K, V)
    A_log, dtb = _gate_params(g, HV)
    S = torch.randn(B, HV, V, K, generator=g, dtype=F64)
    out, final = sequential_decode(q, k, v, A_log, a, dtb, b, S)
    s = S.clone()
    for t in range(N):
        r = gdn_reference(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], A_log, a[:, t:t + 1], dtb, b[:, t:t + 1], s)
        assert _close(out[:, t], r.output[:, 0])
        s = r.state
    assert _close(final, s)
    # state_dtype: rounded after every token (a plain decode over a bf16 pool)
    out_b, final_b = sequential_decode(q, k, v, A_log, a, dtb, b, S, state_dtype=bf)
    assert torch.equal(final_b, final_b.to(bf).double()) and not torch.equal(final_b, final)
    assert _close(out_b, out, 5e-2)


class _Truth:
    """Ground truth of a pool: each slot's exact state (plain decoding of its accepted tokens) and the tokens of its
    last speculative step (pending)."""

    def __init__(self, state):
        self.state = state.clone()
        self.pending = {}

    def accept(self, s, acc, kw):
        toks = self.pending.pop(s, None)
        if toks is None:
            return
        acc = min(max(acc, 0), toks[0].shape[1])
        if acc:
            q, k, v, a, b, A_log, dtb = toks
            _, st = sequential_decode(q[:, :acc], k[:, :acc], v[:, :acc], A_log, a[:, :acc], dtb, b[:, :acc],
                                      self.state[s:s + 1], **kw)
            self.state[s] = st[0]

    def run(self, s, toks, commit, kw):
        q, k, v, a, b, A_log, dtb = toks
        out, st = sequential_decode(q, k, v, A_log, a, dtb, b, self.state[s:s + 1], **kw)
        if commit:
            self.state[s] = st[0]
        else:
            self.pending[s] = toks
        return out[0]


def _row(x, n):
    return x[n:n + 1]


@pytest.mark.parametrize("window,null,seed,eager", [(16, -1, 0, False), (16, 0, 1, False), (8, 2, 2, False),
                                                    (16, -1, 3, False), (16, 0, 4, True), (8, -1, 5, True)])
def test_model_is_sequential_decoding_of_the_accepted_stream(window, null, seed, eager):
    """Random plain and speculative steps over a pool with gaps: every output (accepted or not) is sequential
    decoding from the slot's exact state; after every call each slot's current state (checkpoint + committed rows)
    is the exact state; explicit folds leave it in the checkpoint; padding rows and unused slots touch nothing.
    ``eager``: half the plain one-token steps at window 0 (the eager form: the ring folded with the token, emptied)."""
    g = torch.Generator().manual_seed(100 + seed)
    rng = random.Random(seed)
    H, HV, K, V, slots = 2, 4, 8, 6, 14
    kw = dict(scale=0.7 if seed == 3 else None, use_qk_l2norm=seed != 3,
              softplus_beta=1.5 if seed == 3 else 1.0, softplus_threshold=2.0 if seed == 3 else 20.0)
    A_log, dtb = _gate_params(g, HV)
    pool = torch.randn(slots, HV, V, K, generator=g, dtype=F64)
    model = LazyModel(pool, H, window=window)
    truth = _Truth(pool)
    users = [s for s in range(slots) if s > null][: slots - 3]  # the last 3 slots: a gap no request uses
    unused = [s for s in range(slots) if s not in users]
    frozen = {s: (model.state[s].clone(), model.k[s].clone(), model.u[s].clone(), model.g[s].clone(),
                  model.cursor[s].clone()) for s in unused}
    folds_at = set()
    for step in range(80 if eager else 40):
        B = rng.randint(1, 6)
        chosen = rng.sample(users, B)
        idx = list(chosen)
        pad = rng.randrange(B + 1)
        idx.insert(pad, -1 if null < 0 or rng.random() < 0.5 else rng.randint(0, null))
        B += 1
        T = rng.choice([1, 1, 2, 3, 4, 5, 8, 11, 16] + [1] * (6 if eager else 0))
        spec = rng.random() < 0.6
        model.window = 0 if eager and T == 1 and not spec and rng.random() < 0.5 else window
        toks = _tokens(g, B, T, H, HV, K, V)
        if not kw["use_qk_l2norm"]:  # unit-size keys without the l2norm: the delta rule stays contractive
            toks = (toks[0], (toks[1].double() * K ** -0.5).to(bf)) + toks[2:]
        acc = [rng.randint(-1, T + 2) for _ in range(B)]
        before = {s: [int(x) for x in model.cursor[s]] for s in chosen}
        out = model.step(*toks[:3], A_log, toks[3], dtb, toks[4], torch.tensor(idx, dtype=torch.int32),
                         torch.tensor(acc, dtype=torch.int32) if spec else None, null_block_id=null, **kw)
        assert (out[pad] == 0).all(), "a padding row's outputs"
        for n, s in enumerate(idx):
            if s < 0 or s <= null:
                continue
            truth.accept(s, acc[n] if spec else 0, kw)
            row = tuple(_row(x, n) for x in toks) + (A_log, dtb)
            expected = truth.run(s, row, not spec, kw)
            assert _close(out[n], expected), f"step {step} row {n} slot {s} T={T} spec={spec}"
            ln, base, pend, _ = before[s]
            P = ln + (min(max(acc[n], 0), pend) if spec else 0)
            if model.window == 0:
                folds_at.add(-P - 1)
                assert model.cursor[s].tolist() == [0, (base + P) % 32, 0, 0], (step, s)
                continue
            fold = P + T > window
            if fold:
                folds_at.add(P)
            assert model.cursor[s].tolist() == [(0 if fold else P) + (0 if spec else T),
                                                (base + P) % 32 if fold else base, T if spec else 0, 0], (step, s)
        cur = model.current_state(users)
        for i, s in enumerate(users):
            assert _close(cur[i], truth.state[s]), f"step {step}: slot {s}'s current state"
        if step % 5 == 4:  # an explicit fold of some slots (with the last step's accepted counts), or a reset
            which = rng.sample(users, 3)
            fidx = torch.tensor(which + [-1], dtype=torch.int32)
            if rng.random() < 0.3:
                for s in which:  # a prefill wrote fresh checkpoints
                    fresh = torch.randn(HV, V, K, generator=g, dtype=F64)
                    model.state[s] = fresh
                    truth.state[s] = fresh
                    truth.pending.pop(s, None)
                model.reset(fidx, null_block_id=null)
            else:
                facc = [rng.randint(0, 16) for _ in range(4)]
                for s, a_ in zip(which, facc):
                    truth.accept(s, a_, kw)
                model.fold(fidx, torch.tensor(facc, dtype=torch.int32), null_block_id=null)
                for s in which:
                    truth.pending.pop(s, None)
                    assert _close(model.state[s], truth.state[s]), f"slot {s} after a fold"
            for s in which:
                assert int(model.cursor[s, 0]) == 0 and int(model.cursor[s, 2]) == 0
    assert len([p for p in folds_at if p >= 0]) >= 5, folds_at  # folds in steps at several window lengths
    if eager:  # eager steps over an empty ring and over rings left by lazy steps
        assert -1 in folds_at and len([p for p in folds_at if p < -1]) >= 2, folds_at
    model.window = window
    for s, (st, k_, u_, g_, c_) in frozen.items():
        assert torch.equal(model.state[s], st) and torch.equal(model.cursor[s], c_), f"unused slot {s}"
        assert torch.equal(model.k[s], k_) and torch.equal(model.u[s], u_) and torch.equal(model.g[s], g_)


@pytest.mark.parametrize("window", [16, 8])
def test_fold_at_every_window_length(window):
    """17 slots holding P = 0..16 committed rows; then a step of T tokens on all of them folds exactly the slots with
    P + T > window (then the ring holds the T new rows, G re-based), and an explicit fold folds every P: the
    checkpoint is the exact state, whatever P."""
    g = torch.Generator().manual_seed(7 + window)
    H, HV, K, V = 1, 2, 8, 4
    A_log, dtb = _gate_params(g, HV)
    for T, spec in ((1, False), (4, True), (9, False), (16, True)):
        pool = torch.randn(17, HV, V, K, generator=g, dtype=F64)
        model = LazyModel(pool, H, window=16)  # built with the default window: P up to 16
        truth = _Truth(pool)
        for i in range(16):  # step i: the slots that should hold more than i rows get one more token
            idx = [s if s > i else -1 for s in range(17)]
            toks = _tokens(g, 17, 1, H, HV, K, V)
            model.step(*toks[:3], A_log, toks[3], dtb, toks[4], torch.tensor(idx))
            for s in range(i + 1, 17):
                truth.run(s, tuple(_row(x, s) for x in toks) + (A_log, dtb), True, {})
        # base 0 for every slot, len = slot
        assert model.cursor[:, 0].tolist() == list(range(17)) and model.cursor[:, 1].abs().sum() == 0
        model.window = window
        toks = _tokens(g, 17, T, H, HV, K, V)
        out = model.step(*toks[:3], A_log, toks[3], dtb, toks[4], torch.arange(17),
                         torch.zeros(17, dtype=torch.int32) if spec else None)
        for s in range(17):
            expected = truth.run(s, tuple(_row(x, s) for x in toks[:3]) + (_row(toks[3], s), _row(toks[4], s), A_log,
                                                                            dtb), not spec, {})
            assert _close(out[s], expected), (T, s)
            folded = s + T > window
            ln, base, pend, _ = model.cursor[s].tolist()
            assert (base == (s & 31 if folded else 0)) and ln == (0 if folded else s) + (0 if spec else T)
            assert pend == (T if spec else 0)
            if folded and s > 0:
                # the new rows' G are local to the folded checkpoint: the first is the token's own log decay
                first = model.g[s][:, base]
                assert torch.allclose(first, log_decay(toks[3][s, 0], A_log, dtb))
        acc = torch.randint(0, T + 1, (17,), generator=g, dtype=torch.int32)
        for s in range(17):
            truth.accept(s, int(acc[s]), {})
        model.fold(torch.arange(17), acc if spec else None)
        for s in range(17):
            assert _close(model.state[s], truth.state[s]), (T, s)
        assert model.cursor[:, 0].abs().sum() == 0 and model.cursor[:, 2].abs().sum() == 0


def test_explicit_fold_at_every_length():
    g = torch.Generator().manual_seed(11)
    H, HV, K, V = 2, 2, 8, 4
    A_log, dtb = _gate_params(g, HV)
    for P in range(17):
        pool = torch.randn(1, HV, V, K, generator=g, dtype=F64)
        model = LazyModel(pool, H)
        toks = _tokens(g, 1, max(P, 1), H, HV, K, V)
        if P:
            model.step(*toks[:3], A_log, toks[3], dtb, toks[4], torch.zeros(1, dtype=torch.int64))
        _, exact = sequential_decode(*(x[:, :P] for x in toks[:3]), A_log, toks[3][:, :P], dtb, toks[4][:, :P], pool)
        assert int(model.cursor[0, 0]) == P
        model.fold(torch.zeros(1, dtype=torch.int32))
        assert _close(model.state[0], exact[0]) and model.cursor[0].tolist() == [0, P, 0, 0]


def test_rounding_points():
    """With a bf16 state and fp16 ring rows: the ring holds fp16 values, a folded checkpoint bf16 values, and the
    result stays close to the exact one."""
    g = torch.Generator().manual_seed(5)
    H, HV, K, V, slots = 1, 2, 16, 8, 3
    A_log, dtb = _gate_params(g, HV)
    pool = torch.randn(slots, HV, V, K, generator=g, dtype=F64).to(bf)
    exact = LazyModel(pool, H)
    rounded = LazyModel(pool, H, state_dtype=bf, ring_dtype=torch.float16)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    worst = 0.0
    for _ in range(12):
        toks = _tokens(g, 2, 3, H, HV, K, V)
        o1 = exact.step(*toks[:3], A_log, toks[3], dtb, toks[4], idx)
        o2 = rounded.step(*toks[:3], A_log, toks[3], dtb, toks[4], idx)
        worst = max(worst, ((o1 - o2).abs().max() / o1.abs().max()).item())
    for s in (0, 2):
        rows = rounded.live_rows(s)
        assert len(rows) == int(rounded.cursor[s, 0]) and rows
        for x in (rounded.k[s][:, rows], rounded.u[s][:, rows]):
            assert torch.equal(x, x.half().double())
        assert torch.equal(rounded.state[s], rounded.state[s].to(bf).double())
        assert not torch.equal(rounded.state[s], pool[s].double()), "36 tokens: it folded"
    assert 0 < worst < 5e-2, worst


@pytest.mark.parametrize("restart,flush_min", [(True, None), (False, None), (True, 9)])
def test_ucache_flush_cursors_are_sequential_decoding(restart, flush_min):
    """FlashInfer's flush call: rows fold when hist_len >= flush_min (default 16 - T + 1); the caller commits
    hist_len = P + accepted (a folded row: base += P, hist_len = accepted), or restart_hist_on_flush=True does the
    folded rows' part (ucache_commit) and the caller adds the accepted count."""
    g = torch.Generator().manual_seed(21 + int(restart) + (flush_min or 0))
    rng = random.Random(3)
    H, HV, K, V, B, T = 1, 2, 8, 4, 5, 4
    fm = 16 - T + 1 if flush_min is None else flush_min
    A_log, dtb = _gate_params(g, HV)
    pool = torch.randn(B + 2, HV, V, K, generator=g, dtype=F64)
    model = LazyModel(pool, H, ring=32)
    idx = torch.tensor([3, 0, -1, 5, 1], dtype=torch.int32)
    hist = torch.zeros(B, dtype=torch.int32)
    base = torch.tensor([0, 7, 3, 30, 31], dtype=torch.int32)  # any starting base: the ring wraps
    exact = {int(s): pool[int(s)].clone() for s in idx if s >= 0}
    folds = 0
    for step in range(14):
        toks = _tokens(g, B, T, H, HV, K, V)
        out = model.ucache_step(*toks[:3], A_log, toks[3], dtb, toks[4], idx, hist, base, flush_min=fm)
        assert (out[2] == 0).all()
        acc = torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=torch.int32)
        for n, s in enumerate(idx.tolist()):
            if s < 0:
                continue
            row = tuple(_row(x, n) for x in toks)
            o, st = sequential_decode(*row[:3], A_log, row[3], dtb, row[4], exact[s][None])
            assert _close(out[n], o[0]), (step, n)
            a_ = int(acc[n])
            _, st = sequential_decode(*(x[:, :a_] for x in row[:3]), A_log, row[3][:, :a_], dtb, row[4][:, :a_],
                                      exact[s][None])
            exact[s] = st[0]
            if int(hist[n]) >= fm:
                folds += 1
        folded = hist >= fm
        if restart:
            hist, base = ucache_commit(hist, base, fm)
            hist = hist + acc
        else:
            base = torch.where(folded, (base + hist) & 31, base)
            hist = torch.where(folded, acc, hist + acc)
        for n, s in enumerate(idx.tolist()):
            if s >= 0:
                assert _close(model.ucache_current_state(s, int(hist[n]), int(base[n])), exact[s]), (step, s)
    assert folds >= 3


def test_ucache_verify_only_flat_ring():
    """FlashInfer's verify-only call: a flat 16-row ring from row 0, never a fold: the checkpoint never changes;
    the caller rewinds hist_len = P + accepted and keeps P + T <= 16."""
    g = torch.Generator().manual_seed(31)
    H, HV, K, V, B, T = 2, 4, 8, 4, 3, 3
    A_log, dtb = _gate_params(g, HV)
    pool = torch.randn(B, HV, V, K, generator=g, dtype=F64)
    model = LazyModel(pool, H, ring=16)
    idx = torch.tensor([2, 0, 1], dtype=torch.int64)
    hist = torch.zeros(B, dtype=torch.int32)
    exact = pool.clone()
    for step in range(6):
        toks = _tokens(g, B, T, H, HV, K, V)
        out = model.ucache_step(*toks[:3], A_log, toks[3], dtb, toks[4], idx, hist)
        o, _ = sequential_decode(*toks[:3], A_log, toks[3], dtb, toks[4], exact[idx])
        assert _close(out, o)
        acc = [2, 0, 3][step % 3], [1, 2, 2][step % 3], 2
        for n in range(B):
            a_ = acc[n]
            _, st = sequential_decode(*(x[n:n + 1, :a_] for x in toks[:3]), A_log, toks[3][n:n + 1, :a_], dtb,
                                      toks[4][n:n + 1, :a_], exact[idx[n]][None])
            exact[idx[n]] = st[0]
        hist = hist + torch.tensor(acc, dtype=torch.int32)
        assert int(hist.max()) + T <= 16
        assert torch.equal(model.state, pool)
    for n in range(B):
        assert _close(model.ucache_current_state(int(idx[n]), int(hist[n])), exact[idx[n]])


def test_from_cache_and_live_rows():
    k = torch.randn(4, 2, 32, 8, dtype=bf)
    u = torch.randn(4, 4, 32, 6, dtype=bf)
    gr = torch.randn(4, 4, 32)
    cur = torch.tensor([[3, 30, 2, 0]] * 4, dtype=torch.int32)
    state = torch.randn(4, 4, 6, 8)
    m = LazyModel.from_cache(state, (k, u, gr, cur))
    assert m.state_dtype == torch.float32 and m.ring_dtype == bf and m.H == 2 and m.ring == 32
    assert torch.equal(m.k, k.double()) and torch.equal(m.cursor, cur)
    assert m.live_rows(1) == [30, 31, 0, 1, 2]
    assert LazyModel.from_cache(state, (k[:, :, :16], u[:, :, :16], gr[:, :, :16], None)).ring == 16
    m.cursor[2] = torch.tensor([16, 0, 4, 0], dtype=torch.int32)
    hist = torch.tensor([16, 4, 13, 0], dtype=torch.int32)
    h2, b2 = ucache_commit(hist, torch.tensor([20, 20, 31, 5], dtype=torch.int32), 13)
    assert h2.tolist() == [0, 4, 0, 0] and b2.tolist() == [4, 20, 12, 5]
    with pytest.raises(IndexError, match="past the pool"):
        m.reset(torch.tensor([4]))
    with pytest.raises(ValueError, match="at most 16"):  # 16 committed + 4 accepted pending rows
        m.fold(torch.tensor([2]), torch.tensor([4], dtype=torch.int32))
