"""gdnjit.compat's vLLM and SGLang entry points on the GPU against an independent float64 oracle (issue 25).

The oracle runs each request token by token through the native float64 reference (``gdn_reference``, one token,
batch 1), following the engines' contracts as written in docs/api.md: varlen requests with 0 tokens, 2-D slot maps
with accepted counts 1..S, per-token writes with null slots, padding rows, SGLang's buffers and random EAGLE trees
(branching <= 4, up to 16 tokens), fp32 and bf16 states, and whole calls captured in CUDA graphs. Outputs and pools are
poisoned / checked in full: slots no request writes must keep their bits.
"""

from __future__ import annotations

import contextlib
import pathlib
import random
import sys

import pytest
import torch

import gdnjit
import gdnjit.torch_ops  # noqa: F401  (registers the ops)
from gdnjit.compat import sglang, vllm
from gdnjit.reference.gdn import gdn_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"
H, HV, K, V = 4, 8, 128, 128
F64 = torch.float64


def _rel(x, ref):
    return (x.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)


def _token(q, k, v, a, b, A_log, dtb, S, l2norm=True, given=False):
    """One token of one request in float64: (output [HV, V], state [HV, V, K])."""
    if given:  # g, beta given: a = g (log decay), b = beta; run with A_log = 0, dt_bias = 0 and softplus -> identity
        r = gdn_reference(q[None, None], k[None, None], v[None, None], torch.zeros(HV, dtype=F64),
                          -a[None, None].double(), torch.zeros(HV, dtype=F64), torch.logit(b.double())[None, None],
                          S[None].double(), use_qk_l2norm=l2norm, softplus_threshold=-1e30)
    else:
        r = gdn_reference(q[None, None], k[None, None], v[None, None], A_log, a[None, None], dtb, b[None, None],
                          S[None].double(), use_qk_l2norm=l2norm)
    return r.output[0, 0], r.state[0]


def _inputs(total, sdt, seed, slots=64):
    g = torch.Generator(device="cpu").manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(1, total, H, K, generator=g).to(bf)
    k = torch.randn(1, total, H, K, generator=g).to(bf)
    v = torch.randn(1, total, HV, V, generator=g).to(bf)
    a = torch.randn(total, HV, generator=g).to(bf)
    b = torch.randn(total, HV, generator=g).to(bf)
    A_log = torch.rand(HV, generator=g)
    dtb = torch.randn(HV, generator=g)
    pool = (torch.randn(slots, HV, V, K, generator=g) * 0.1).to(sdt)
    return q, k, v, a, b, A_log, dtb, pool


def _cuda(*xs):
    return [x.to(DEV) for x in xs]


_KINDS = {  # the recurrent variants the H200 dispatcher picks for SGLang's verify at B = 1 (staged) and B >= 32
    "staged": {"lanes_per_row": 4, "ilp": 1, "tile_v": 32, "stage": True, "form": "recurrent", "pipe": 1,
               "k_warps": 1, "l2_prefetch": True},
    "staged16": {"lanes_per_row": 16, "ilp": 2, "tile_v": 32, "stage": True, "form": "recurrent", "pipe": 1,
                 "k_warps": 1, "l2_prefetch": True},  # an fp32 tree asks for 32 warps per SM in it (64 registers)
    "unstaged": {"lanes_per_row": 16, "ilp": 4, "tile_v": 8, "stage": False, "form": "recurrent", "pipe": 1,
                 "k_warps": 1, "l2_prefetch": False},
    # the pipelined kernel (the native verify's at mid batch, T 5..8: two or four items per CTA, the next one's state
    # and tokens in flight)
    "pipe": {"lanes_per_row": 8, "ilp": 2, "tile_v": 64, "stage": True, "form": "recurrent", "pipe": 2, "k_warps": 1,
             "l2_prefetch": False},
    "pipe4": {"lanes_per_row": 8, "ilp": 4, "tile_v": 64, "stage": True, "form": "recurrent", "pipe": 4, "k_warps": 1,
              "l2_prefetch": False},
}


def _staging(stage):
    """None: the dispatcher's variant; True / False: a recurrent variant with the tokens staged in shared memory first
    or loaded in the token loop (the two paths of a varlen request of at most T tokens); a name of _KINDS: that
    variant (the 1-warp one asks for 18 CTAs per SM with bf16 state, SGLang's verify; "pipe", "pipe4": the pipelined
    kernel)."""
    if stage is None:
        return contextlib.nullcontext()
    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "ops"))
    from gdn_cases import forcing

    return forcing(_KINDS[stage] if isinstance(stage, str) else {"form": "recurrent", "pipe": 1, "stage": stage})


def _tol(sdt):
    return (2e-2, 2e-3) if sdt == torch.float32 else (2e-2, 2e-2)  # (bf16 outputs, state)


# ---- vLLM -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [None, True, False, "staged", "unstaged", "pipe", "pipe4"])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,S", [(1, 2), (7, 4), (33, 8), (70, 3), (5, 16)])
def test_vllm_spec_varlen_accepted(N, S, sdt, stage):
    """vLLM's spec-decode call: varlen lengths 0..S, 2-D slot map (null block 0 in padded rows and columns),
    accepted counts 1..S; the state after token t lands in column t; other slots keep their bits. Staged tokens
    forced on and off besides the dispatcher's choice, the staged B = 1 variant with its L2 prefetch (the count
    and the slot map's first columns read together), the 1-warp one of B >= 32 (capped at 96 registers with bf16
    state) and the pipelined kernel (2 and 4 items per CTA, each row's indices loaded a step ahead)."""
    if stage in ("pipe", "pipe4") and S > 8:
        pytest.skip("the pipelined kernel takes at most 8 tokens (gdn.yaml: pipe == 1 or T <= 8)")
    rng = random.Random(N * 100 + S)
    lens = [rng.randint(0, S) for _ in range(N)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total = max(cu[-1], 1)
    q, k, v, a, b, A_log, dtb, pool = _inputs(total, sdt, N + S)
    pool = torch.cat([pool] * (1 + (N * S) // 60))  # room for distinct slots
    slots = rng.sample(range(1, pool.shape[0]), N * S)
    idx = torch.tensor(slots, dtype=torch.int32).view(N, S)
    for n in range(N):
        if rng.random() < 0.15:
            idx[n] = 0  # a padded request (null block)
        elif rng.random() < 0.2:
            idx[n, rng.randrange(S)] = 0  # a dropped write
    acc = torch.tensor([rng.randint(1, S) for _ in range(N)], dtype=torch.int32)
    for n in range(N):
        if idx[n, acc[n] - 1] == 0 and rng.random() < 0.5:
            idx[n, acc[n] - 1] = slots[n * S + acc[n] - 1]
    exp_out = torch.zeros(1, total, HV, V, dtype=F64)
    exp_pool = pool.double().clone()
    written = set()
    for n in range(N):
        slot = int(idx[n, acc[n] - 1])
        if lens[n] == 0 or slot <= 0:
            continue
        S_ = pool[slot]
        for t in range(lens[n]):
            tok = cu[n] + t
            o, S_ = _token(q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dtb, S_)
            exp_out[0, tok] = o
            dst = int(idx[n, t])
            if dst > 0:
                exp_pool[dst] = S_
                written.add(dst)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    cud, idxd, accd = _cuda(torch.tensor(cu, dtype=torch.int32), idx, acc)
    with _staging(stage):
        o, st = vllm.fused_sigmoid_gating_delta_rule_update(Ad, ad, bd, dd, qd, kd, vd, initial_state=pd,
                                                            inplace_final_state=True, cu_seqlens=cud,
                                                            ssm_state_indices=idxd, num_accepted_tokens=accd,
                                                            use_qk_l2norm_in_kernel=True)
        torch.cuda.synchronize()
    assert st is pd
    otol, stol = _tol(sdt)
    # rows of the requests only: the flat token dim may be longer than cu_seqlens[-1] (here when every request has 0
    # tokens), and rows past it belong to no request (not written, as in vLLM)
    if cu[-1]:
        assert _rel(o.cpu()[:, :cu[-1]], exp_out[:, :cu[-1]]) < otol
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    assert torch.equal(pd.cpu()[untouched], pool[untouched])
    if written:
        w = sorted(written)
        assert _rel(pd.cpu()[w], exp_pool[w]) < stol


@pytest.mark.parametrize("stage", [None, "unstaged", "pipe"])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_vllm_spec_batched_accepted(sdt, stage):
    """vLLM's spec call without cu_seqlens: q as [N, S, H, K] (every request S tokens), the 2-D slot map and accepted
    counts as with varlen (a null-block request, a dropped write); the dispatcher's variant, the 1-warp one and the
    pipelined kernel."""
    N, S = 6, 5
    rng = random.Random(17)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * S, sdt, 23)
    idx = torch.tensor(rng.sample(range(1, 64), N * S), dtype=torch.int32).view(N, S)
    idx[2] = 0  # a padded request (null block)
    idx[4, 1] = 0  # a dropped write
    acc = torch.tensor([rng.randint(1, S) for _ in range(N)], dtype=torch.int32)
    exp_out = torch.zeros(N, S, HV, V, dtype=F64)
    exp_pool = pool.double().clone()
    written = set()
    for n in range(N):
        slot = int(idx[n, acc[n] - 1])
        if slot <= 0:
            continue
        S_ = pool[slot]
        for t in range(S):
            tok = n * S + t
            o, S_ = _token(q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dtb, S_)
            exp_out[n, t] = o
            if idx[n, t] > 0:
                exp_pool[int(idx[n, t])] = S_
                written.add(int(idx[n, t]))
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    with _staging(stage):
        o, st = vllm.fused_sigmoid_gating_delta_rule_update(
            Ad, ad.view(N, S, HV), bd.view(N, S, HV), dd, qd.view(N, S, H, K), kd.view(N, S, H, K),
            vd.view(N, S, HV, V), initial_state=pd, inplace_final_state=True, ssm_state_indices=idx.to(DEV),
            num_accepted_tokens=acc.to(DEV), use_qk_l2norm_in_kernel=True)
        torch.cuda.synchronize()
    assert st is pd
    otol, stol = _tol(sdt)
    live = [n for n in range(N) if idx[n, acc[n] - 1] > 0]
    assert _rel(o.cpu()[live], exp_out[live]) < otol
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    assert torch.equal(pd.cpu()[untouched], pool[untouched])
    w = sorted(written)
    assert _rel(pd.cpu()[w], exp_pool[w]) < stol


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_vllm_decode_1d_strided_indices_null_block(sdt):
    """vLLM's non-spec decode: varlen of 1-token requests (padded tail of length 0), 1-D indices that are a column
    view of a block table (strided), slot 0 = null block (skipped: zero output, slot 0 untouched)."""
    N = 37
    rng = random.Random(5)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N, sdt, 11)
    table = torch.zeros(N + 3, 4, dtype=torch.int32)
    table[:N, 0] = torch.tensor(rng.sample(range(1, 64), N), dtype=torch.int32)
    table[3, 0] = 0
    cu = list(range(N + 1)) + [N, N, N]  # three padded requests of length 0
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    tabd = table.to(DEV)
    o, _ = vllm.fused_sigmoid_gating_delta_rule_update(Ad, ad, bd, dd, qd, kd, vd, initial_state=pd,
                                                       cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEV),
                                                       ssm_state_indices=tabd[:, 0], use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    exp_out = torch.zeros(1, N, HV, V, dtype=F64)
    exp_pool = pool.double().clone()
    for n in range(N):
        s = int(table[n, 0])
        if s <= 0:
            continue
        exp_out[0, n], exp_pool[s] = _token(q[0, n], k[0, n], v[0, n], a[n], b[n], A_log, dtb, pool[s])
    otol, stol = _tol(sdt)
    assert _rel(o.cpu(), exp_out) < otol
    assert _rel(pd.cpu(), exp_pool) < stol
    assert torch.equal(pd.cpu()[0], pool[0])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 37, 60])
def test_packed_decode(N, sdt, engine):
    """The engines' default non-spec decode (fused_recurrent_gated_delta_rule_packed_decode): q / k / v read from the
    conv output's packed rows (inside a wider buffer: its row stride), out written (zeros for padding: vLLM's null
    block 0 and a -1; SGLang's -1, its slot 0 live), the pool updated at live slots only; SGLang's beta rounded to
    bf16 first (the oracle too); then the call captured in a CUDA graph replays new inputs to the eager bits."""
    fn = (vllm if engine == "vllm" else sglang).fused_recurrent_gated_delta_rule_packed_decode
    rng = random.Random(N)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N, sdt, 90 + N)
    width = 2 * H * K + HV * V
    buf = torch.zeros(N, width + 64, dtype=torch.bfloat16)
    buf[:, :width] = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], 1)
    slots = torch.tensor(rng.sample(range(1, 64), N), dtype=torch.int32)
    if N > 1:
        slots[1], slots[N // 2] = 0, -1
    live = (slots > 0) if engine == "vllm" else (slots >= 0)
    b_oracle = b if engine == "vllm" else torch.logit(torch.sigmoid(b.float()).to(torch.bfloat16).double())
    bufd, ad, bd, Ad, dd, pd, sd = _cuda(buf, a, b, A_log, dtb, pool, slots)
    out = torch.full((N, 1, HV, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    o, st = fn(bufd[:, :width], ad, bd, Ad, dd, K ** -0.5, pd, out, sd, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert o is out and st is pd
    exp_out = torch.zeros(N, 1, HV, V, dtype=F64)
    exp_pool = pool.double().clone()
    for n in range(N):
        s = int(slots[n])
        if live[n]:
            exp_out[n, 0], exp_pool[s] = _token(q[0, n], k[0, n], v[0, n], a[n], b_oracle[n], A_log, dtb, pool[s])
    otol, stol = _tol(sdt)
    assert _rel(out.cpu(), exp_out) < otol and (out.cpu()[~live] == 0).all()
    assert _rel(pd.cpu(), exp_pool) < stol
    written = set(slots[live].tolist())
    untouched = [s for s in range(64) if s not in written]
    assert torch.equal(pd.cpu()[untouched], pool[untouched])

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(bufd[:, :width], ad, bd, Ad, dd, K ** -0.5, pd, out, sd, use_qk_l2norm_in_kernel=True)
    bufd.normal_()
    ad.normal_()
    pool_before = pd.clone()
    graph.replay()
    want_pool = pool_before.clone()
    want = torch.empty_like(out)
    fn(bufd[:, :width].clone(), ad, bd, Ad, dd, K ** -0.5, want_pool, want, sd, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(pd, want_pool)


@pytest.mark.parametrize("given, stage", [(False, None), (True, None), (False, "pipe")])
def test_vllm_not_inplace_and_given_gates(given, stage):
    """inplace_final_state=False: every token's state in a new [total, HV, V, K] tensor (row = flat token), the pool
    untouched; fused_recurrent_gated_delta_rule with g / beta computed outside. Raw gates also in the pipelined
    kernel (given gates run unstaged)."""
    N, S = 9, 4
    rng = random.Random(3)
    lens = [rng.randint(0, S) for _ in range(N)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total = cu[-1]
    q, k, v, a, b, A_log, dtb, pool = _inputs(total, torch.float32, 21)
    idx = torch.tensor(rng.sample(range(1, 64), N * S), dtype=torch.int32).view(N, S)
    acc = torch.tensor([rng.randint(1, S) for _ in range(N)], dtype=torch.int32)
    g_log = -torch.rand(total, HV) * 2  # given gates (fp32)
    beta = torch.rand(total, HV)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    args = dict(initial_state=pd, inplace_final_state=False, cu_seqlens=torch.tensor(cu, dtype=torch.int32,
                device=DEV), ssm_state_indices=idx.to(DEV), num_accepted_tokens=acc.to(DEV), use_qk_l2norm_in_kernel=True)
    with _staging(stage):
        if given:
            o, fin = vllm.fused_recurrent_gated_delta_rule(qd, kd, vd, g_log.to(DEV), beta.to(DEV), **args)
        else:
            o, fin = vllm.fused_sigmoid_gating_delta_rule_update(Ad, ad, bd, dd, qd, kd, vd, **args)
        torch.cuda.synchronize()
    assert torch.equal(pd.cpu(), pool) and fin.shape == (total, HV, V, K)
    exp_out = torch.zeros(1, total, HV, V, dtype=F64)
    exp_fin = torch.zeros(total, HV, V, K, dtype=F64)
    for n in range(N):
        S_ = pool[int(idx[n, acc[n] - 1])]
        for t in range(lens[n]):
            tok = cu[n] + t
            if given:
                o_, S_ = _token(q[0, tok], k[0, tok], v[0, tok], g_log[tok], beta[tok], A_log, dtb, S_, given=True)
            else:
                o_, S_ = _token(q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dtb, S_)
            exp_out[0, tok], exp_fin[tok] = o_, S_
    assert _rel(o.cpu(), exp_out) < 2e-2
    assert _rel(fin.cpu(), exp_fin) < 2e-3


def test_vllm_graph_capture():
    """A captured vLLM spec call replays with new inputs copied into its buffers (same results as eager)."""
    N, S = 16, 4
    rng = random.Random(8)
    cu = torch.arange(0, N * S + 1, S, dtype=torch.int32)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * S, torch.float32, 31)
    pool = torch.cat([pool, pool])
    idx = torch.tensor(rng.sample(range(1, 128), N * S), dtype=torch.int32).view(N, S)
    acc = torch.tensor([rng.randint(1, S) for _ in range(N)], dtype=torch.int32)
    bufs = _cuda(q, k, v, a, b, A_log, dtb, pool.clone(), cu, idx, acc)
    qd, kd, vd, ad, bd, Ad, dd, pd, cud, idxd, accd = bufs

    def call():
        return vllm.fused_sigmoid_gating_delta_rule_update(Ad, ad, bd, dd, qd, kd, vd, initial_state=pd,
                                                           cu_seqlens=cud, ssm_state_indices=idxd,
                                                           num_accepted_tokens=accd, use_qk_l2norm_in_kernel=True)[0]
    call()  # compile outside the capture
    pd.copy_(pool.to(DEV))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    q2, k2, v2, *_ = _inputs(N * S, torch.float32, 32)
    acc2 = torch.tensor([rng.randint(1, S) for _ in range(N)], dtype=torch.int32)
    for dst, src in ((qd, q2), (kd, k2), (vd, v2), (accd, acc2)):
        dst.copy_(src.to(DEV))
    pd.copy_(pool.to(DEV))
    graph.replay()
    torch.cuda.synchronize()
    got_out, got_pool = out.clone(), pd.clone()
    pd.copy_(pool.to(DEV))
    ref = call()
    torch.cuda.synchronize()
    assert torch.equal(got_out, ref) and torch.equal(got_pool, pd)


# ---- SGLang ---------------------------------------------------------------------------------------


def _random_tree(T, rng):
    """parent[t] < t for t >= 1 (root 0), each node with at most 4 children (depth < T)."""
    parent, children = [0], [0] * T
    for t in range(1, T):
        p = rng.choice([i for i in range(t) if children[i] < 4])
        children[p] += 1
        parent.append(p)
    return parent


@pytest.mark.parametrize("stage, update", [(None, False), (True, False), (False, False), ("unstaged", False),
                                           ("pipe", False), ("pipe4", False), (None, True), (True, True),
                                           ("unstaged", True), ("pipe", True)])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("N,T", [(1, 2), (5, 4), (24, 8), (64, 6), (3, 16), ("batched", 5)])
def test_sglang_verify(N, T, tree, sdt, stage, update):
    """SGLang's target verify: draft length T as varlen (one request shorter), disable_state_update, the per-step
    buffer with intermediate_state_indices (a -1 row: not cached), padding requests (slot -1: zero state, outputs
    written), random EAGLE trees; the pool keeps its bits. Staged tokens forced on and off besides the dispatcher's
    choice, the 1-warp variant of B >= 32 (with bf16 state asked for 18 CTAs per SM) and the pipelined kernel (chains
    only). "batched": q as [N, T, H, K] without cu_seqlens (every request T tokens). update: the same call with the
    state updated (the state after a request's last token written to its slot; padding rows write nothing)."""
    if stage in ("pipe", "pipe4") and T > 8:
        pytest.skip("the pipelined kernel takes at most 8 tokens (gdn.yaml: pipe == 1 or T <= 8)")
    batched = N == "batched"
    N = 9 if batched else N
    rng = random.Random(N * 10 + T + 1000 * tree)
    lens = [T] * N
    if not batched:
        lens[rng.randrange(N)] = rng.randint(1, T)  # a request shorter than the bound (e.g. a tree's pruned draft)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total = cu[-1]
    q, k, v, a, b, A_log, dtb, pool = _inputs(total, sdt, N + T)
    slots = torch.tensor(rng.sample(range(64), N), dtype=torch.int32)
    for n in range(N):
        if rng.random() < 0.15:
            slots[n] = -1
    if batched:
        slots[rng.randrange(N)] = -1  # a padding request in the loop over every token (no varlen break)
    rows = torch.tensor(rng.sample(range(N + 2), N), dtype=torch.int32)
    for n in range(N):
        if rng.random() < 0.1:
            rows[n] = -1
    parents = torch.tensor([_random_tree(T, rng) for _ in range(N)], dtype=torch.int32) if tree else None
    buf = torch.full((N + 2, T, HV, V, K), float("nan"), dtype=sdt)
    exp_out = torch.zeros(1, total, HV, V, dtype=F64)
    exp_buf = buf.double().clone()
    exp_pool = {}  # update: slot -> the state after its request's last token
    for n in range(N):
        S_ = pool[int(slots[n])].double() if slots[n] >= 0 else torch.zeros(HV, V, K, dtype=F64)
        r = int(rows[n])
        for t in range(lens[n]):
            tok = cu[n] + t
            if tree and t > 0 and r >= 0:
                S_ = exp_buf[r, int(parents[n, t])]
            o_, S_ = _token(q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dtb, S_)
            exp_out[0, tok] = o_
            if r >= 0:
                exp_buf[r, t] = S_.to(sdt).double()  # stored in the buffer's dtype (a tree reloads the rounded value)
        if update and slots[n] >= 0:
            exp_pool[int(slots[n])] = S_
    qd, kd, vd, ad, bd, Ad, dd, pd, bufd = _cuda(q, k, v, a, b, A_log, dtb, pool, buf)
    if batched:
        qd, kd, vd = (x.view(N, T, *x.shape[2:]) for x in (qd, kd, vd))
    with _staging(stage):
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, pd, slots.to(DEV), use_qk_l2norm_in_kernel=True,
            cu_seqlens=None if batched else torch.tensor(cu, dtype=torch.int32, device=DEV),
            disable_state_update=not update, intermediate_states_buffer=bufd, intermediate_state_indices=rows.to(DEV),
            cache_steps=None if batched else T, retrieve_parent_token=None if parents is None else parents.to(DEV))
        torch.cuda.synchronize()
    otol, stol = _tol(sdt)
    untouched = [s for s in range(pool.shape[0]) if s not in exp_pool]
    assert torch.equal(pd.cpu()[untouched], pool[untouched])
    if exp_pool:
        assert _rel(pd.cpu()[list(exp_pool)], torch.stack(list(exp_pool.values()))) < stol
    assert _rel(o.cpu().reshape(exp_out.shape), exp_out) < otol
    used = sorted(int(r) for r in rows if r >= 0)
    unused = [r for r in range(N + 2) if r not in used]
    got = bufd.cpu()
    assert torch.isnan(got[unused].float()).all()
    steps = {int(rows[n]): lens[n] for n in range(N) if rows[n] >= 0}  # a row's steps past its request's length: unwritten
    assert all(torch.isnan(got[r, steps[r]:].float()).all() for r in used)
    written = torch.cat([got[r, :steps[r]] for r in used]) if used else got[:0]
    expected = torch.cat([exp_buf[r, :steps[r]] for r in used]) if used else exp_buf[:0]
    if used:
        assert _rel(written, expected) < stol


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_sglang_decode_update(sdt):
    """SGLang's generic decode: 1-token varlen requests, state updated in place, a -1 slot computed from zeros."""
    N = 19
    rng = random.Random(2)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N, sdt, 41)
    slots = torch.tensor(rng.sample(range(64), N), dtype=torch.int32)
    slots[4] = -1
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    o = sglang.fused_sigmoid_gating_delta_rule_update(Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, pd, slots.to(DEV),
                                                      use_qk_l2norm_in_kernel=True,
                                                      cu_seqlens=torch.arange(N + 1, dtype=torch.int32, device=DEV))
    torch.cuda.synchronize()
    exp_out = torch.zeros(1, N, HV, V, dtype=F64)
    exp_pool = pool.double().clone()
    for n in range(N):
        s = int(slots[n])
        S0 = pool[s] if s >= 0 else torch.zeros(HV, V, K)
        exp_out[0, n], S_ = _token(q[0, n], k[0, n], v[0, n], a[n], b[n], A_log, dtb, S0)
        if s >= 0:
            exp_pool[s] = S_
    otol, stol = _tol(sdt)
    assert _rel(o.cpu(), exp_out) < otol
    assert _rel(pd.cpu(), exp_pool) < stol


@pytest.mark.parametrize("kind", list(_KINDS))
@pytest.mark.parametrize("T", [3, 4, 5, 8])
def test_sglang_tree_token_equals_the_chain_of_its_path(T, kind):
    """Bitwise, fp32 state (the buffer holds the running state exactly): every token of a tree verify gives the output
    and buffered state that a chain verify of its root-to-token path gives, in the same variant (a parent that is not
    the previous token read back from the buffer), staged or not, at T 3..8."""
    N = 6
    rng = random.Random(T * 7 + len(kind))
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * T, torch.float32, 300 + T)
    parents = [_random_tree(T, rng) for _ in range(N)]
    parents[0] = [0] + [t - 1 for t in range(1, T)]  # a chain among the trees
    slots = torch.tensor(rng.sample(range(64), N), dtype=torch.int32)
    paths = []  # (request, token, flat rows of its root-to-token path)
    for n in range(N):
        for t in range(T):
            path, x = [t], t
            while x > 0:
                x = parents[n][x]
                path.append(x)
            paths.append((n, t, [n * T + j for j in reversed(path)]))
    rows = [r for _, _, p in paths for r in p]
    cu2 = [0]
    for _, _, p in paths:
        cu2.append(cu2[-1] + len(p))
    M = len(paths)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    ix = torch.tensor(rows, device=DEV)

    def verify(q_, k_, v_, a_, b_, cu, slot, nreq, parent):
        buf = torch.full((nreq, T, HV, V, K), float("nan"), device=DEV)
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            Ad, a_, dd, 1.0, 20.0, q_, k_, v_, b_, pd, slot, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEV), disable_state_update=True,
            intermediate_states_buffer=buf, intermediate_state_indices=torch.arange(nreq, dtype=torch.int32, device=DEV),
            cache_steps=T, retrieve_parent_token=parent)
        return o, buf

    with _staging(kind):
        o_tree, buf_tree = verify(qd, kd, vd, ad, bd, list(range(0, N * T + 1, T)), slots.to(DEV), N,
                                  torch.tensor(parents, dtype=torch.int32, device=DEV))
        o_path, buf_path = verify(qd[:, ix], kd[:, ix], vd[:, ix], ad[ix], bd[ix], cu2,
                                  slots.repeat_interleave(T).to(DEV), M, None)
        torch.cuda.synchronize()
    for m, (n, t, p) in enumerate(paths):
        last = cu2[m + 1] - 1
        assert torch.equal(o_tree[0, n * T + t], o_path[0, last]), (n, t, p)
        assert torch.equal(buf_tree[n, t], buf_path[m, len(p) - 1]), (n, t, p)


def _both(kind, engine, native):
    """The engine call and the native one, in the variant kind ``kind``; the engine call's result."""
    with _staging(kind):
        got = engine()
        native()
        torch.cuda.synchronize()
    return got


def _native_mtp(inputs, N, T, pool, read, out, **kw):
    """gdnjit.gated_delta_rule_mtp on an engine call's flat inputs (q, k, v, a, b, A_log, dt_bias), N requests of T
    tokens each: the native call doing the same work."""
    import gdnjit

    q, k, v, a, b, A_log, dtb = inputs
    gdnjit.gated_delta_rule_mtp(q.view(N, T, H, K), k.view(N, T, H, K), v.view(N, T, HV, V), pool, read, A_log,
                                a.view(N, T, HV), dtb, b.view(N, T, HV), output=out, **kw)


@pytest.mark.parametrize("kind, sdt, tree, T", [("unstaged", torch.bfloat16, False, 4), ("unstaged", torch.bfloat16, False, 8),
                                                 ("staged16", torch.float32, True, 4), ("pipe", torch.bfloat16, False, 8),
                                                 ("pipe4", torch.float32, False, 6), ("staged", torch.bfloat16, False, 4),
                                                 ("staged", torch.float32, False, 4), ("staged16", torch.bfloat16, False, 8)])
def test_sglang_verify_matches_the_native_verify_bitwise(kind, sdt, tree, T):
    """SGLang's verify dispatches as the native verify of its shape (gdn.yaml dispatch_params) but may ask ptxas for
    another register budget (min blocks 18 for the 1-warp bf16 chain at T <= 4, a 96-register cap at T > 4, 32 warps
    per SM for a staged fp32 tree, min blocks 1 for the staged 4-lane variant of B = 1 and for the staged bf16
    16-lane one of B = 1, T = 8) or carry its indices through the pipelined kernel: same source for the tokens, same
    bits. A tree whose parents are each the previous token is the chain. (docs/design.md 4.8)"""
    N = 6
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * T, sdt, 77)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    slots = torch.tensor(random.Random(5).sample(range(64), N), dtype=torch.int32, device=DEV)
    rows = torch.arange(N, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, N * T + 1, T, dtype=torch.int32, device=DEV)
    parents = torch.tensor([[0] + list(range(T - 1))] * N, dtype=torch.int32, device=DEV) if tree else None
    buf_c = torch.full((N, T, HV, V, K), float("nan"), dtype=sdt, device=DEV)
    buf_n = buf_c.clone()
    out_n = torch.empty(N, T, HV, V, dtype=torch.bfloat16, device=DEV)
    o_c = _both(kind, lambda: sglang.fused_sigmoid_gating_delta_rule_update(
        Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, pd, slots, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
        disable_state_update=True, intermediate_states_buffer=buf_c, intermediate_state_indices=rows,
        retrieve_parent_token=parents),
        lambda: _native_mtp((qd, kd, vd, ad, bd, Ad, dd), N, T, pd, slots, out_n, intermediate_states_buffer=buf_n,
                            disable_state_update=True))
    assert torch.equal(o_c.reshape(out_n.shape), out_n)
    assert torch.equal(buf_c, buf_n)


@pytest.mark.parametrize("kind, T", [("unstaged", 4), ("unstaged", 8), ("pipe", 8), ("pipe4", 5), ("staged", 4)])
def test_vllm_spec_matches_the_native_verify_bitwise(kind, T):
    """vLLM's spec verify (bf16 state; the 1-warp variant of B >= 32, capped at 96 registers; the pipelined kernel;
    the staged 4-lane variant of B = 1, which asks ptxas for min blocks 1 where the native call does not) against the native multi-token call doing the same work (the slot map as ssm_state_indices, the accepted column
    as the read slot): same outputs and pool bits. (docs/design.md 4.8)"""
    N, sdt = 6, torch.bfloat16
    rng = random.Random(T)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * T, sdt, 78)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    idx = torch.tensor(rng.sample(range(1, 64), N * T), dtype=torch.int32, device=DEV).view(N, T)
    acc = torch.tensor([rng.randint(1, T) for _ in range(N)], dtype=torch.int32, device=DEV)
    read = idx.gather(1, (acc.long() - 1).unsqueeze(1)).squeeze(1).contiguous()
    cu = torch.arange(0, N * T + 1, T, dtype=torch.int32, device=DEV)
    pool_n = pd.clone()
    out_n = torch.empty(N, T, HV, V, dtype=torch.bfloat16, device=DEV)
    o_c, _ = _both(kind, lambda: vllm.fused_sigmoid_gating_delta_rule_update(
        Ad, ad, bd, dd, qd, kd, vd, initial_state=pd, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
        num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True),
        lambda: _native_mtp((qd, kd, vd, ad, bd, Ad, dd), N, T, pool_n, read, out_n, ssm_state_indices=idx,
                            disable_state_update=False))
    assert torch.equal(o_c.reshape(out_n.shape), out_n)
    assert torch.equal(pd, pool_n)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [8, 9, 16, 20, 24, 28, 32, 256])
def test_vllm_varlen_decode_matches_the_native_decode_bitwise(N, sdt):
    """vLLM's one-token varlen decode (cu_seqlens, 1-D slots) against the native decode of the same requests: same
    outputs and pool bits. N * HV 64 / 72 / 128 / 160 / 192 / 224 / 256 / 2048 cross the T = 1 rules' batch regions;
    at 128 (both state dtypes), 160..256 (fp32) and 2048 (bf16) the varlen call runs the native variant's lanes with
    other rows per thread or per CTA or the L2 prefetch (gdn.yaml retile: the same per-row arithmetic).
    (docs/design.md 4.8)"""
    slots = max(64, N + 8)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N, sdt, 79, slots)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    read = torch.tensor(random.Random(N).sample(range(1, slots), N), dtype=torch.int32, device=DEV)
    cu = torch.arange(N + 1, dtype=torch.int32, device=DEV)
    pool_n = pd.clone()
    out_n = torch.full((N, 1, HV, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    o_c, _ = vllm.fused_sigmoid_gating_delta_rule_update(Ad, ad, bd, dd, qd, kd, vd, initial_state=pd, cu_seqlens=cu,
                                                         ssm_state_indices=read, use_qk_l2norm_in_kernel=True)
    gdnjit.gated_delta_rule_decode_pretranspose(qd.view(N, 1, H, K), kd.view(N, 1, H, K), vd.view(N, 1, HV, V), None,
                                                Ad, ad.view(N, 1, HV), dd, bd.view(N, 1, HV), output=out_n,
                                                initial_state=pool_n, initial_state_indices=read)
    torch.cuda.synchronize()
    assert torch.equal(o_c.reshape(out_n.shape), out_n)
    assert torch.equal(pd, pool_n)
    assert not torch.equal(pd, pool.to(DEV))  # the requests' slots were written


def test_sglang_tree_graph_capture():
    """A captured SGLang tree verify replays with new drafts and new trees copied into its buffers."""
    N, T = 32, 8
    rng = random.Random(9)
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * T, torch.bfloat16, 51)
    par = torch.tensor([_random_tree(T, rng) for _ in range(N)], dtype=torch.int32)
    buf = torch.zeros(N, T, HV, V, K, dtype=torch.bfloat16)
    bufs = _cuda(q, k, v, a, b, A_log, dtb, pool, buf, par, torch.arange(N, dtype=torch.int32),
                 torch.arange(0, N * T + 1, T, dtype=torch.int32))
    qd, kd, vd, ad, bd, Ad, dd, pd, bufd, pard, slotd, cud = bufs

    def call():
        return sglang.fused_sigmoid_gating_delta_rule_update(
            Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, pd, slotd, use_qk_l2norm_in_kernel=True, cu_seqlens=cud,
            disable_state_update=True, intermediate_states_buffer=bufd, intermediate_state_indices=slotd,
            retrieve_parent_token=pard)
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    q2, k2, v2, *_ = _inputs(N * T, torch.bfloat16, 52)
    par2 = torch.tensor([_random_tree(T, rng) for _ in range(N)], dtype=torch.int32)
    for dst, src in ((qd, q2), (kd, k2), (vd, v2), (pard, par2)):
        dst.copy_(src.to(DEV))
    graph.replay()
    torch.cuda.synchronize()
    got_out, got_buf = out.clone(), bufd.clone()
    ref = call()
    torch.cuda.synchronize()
    assert torch.equal(got_out, ref) and torch.equal(got_buf, bufd)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 40])
def test_sglang_verify_16_draft_tokens_model_heads(B, sdt):
    """SGLang's verify as its model code calls it (keyword arguments, an explicit scale, bf16 dt_bias, gates as
    [tokens, HV]) with 16 draft tokens per request (a DFlash-style block; cache_steps 16) at Qwen3.5's head counts
    (H 16, HV 32): outputs and every cached step against the float64 reference, the pool untouched, buffer rows of
    no request left as they were; then the call captured in a CUDA graph replays to the same bits."""
    T, Hm, HVm = 16, 16, 32
    g = torch.Generator(device="cpu").manual_seed(1600 + B)
    bf = torch.bfloat16
    q = torch.randn(1, B * T, Hm, K, generator=g).to(bf)
    k = torch.randn(1, B * T, Hm, K, generator=g).to(bf)
    v = torch.randn(1, B * T, HVm, V, generator=g).to(bf)
    a = torch.randn(B * T, HVm, generator=g).to(bf)
    b = torch.randn(B * T, HVm, generator=g).to(bf)
    A_log = torch.rand(HVm, generator=g)
    dtb = torch.randn(HVm, generator=g).to(bf)
    pool = (torch.randn(B + 3, HVm, V, K, generator=g) * 0.1).to(sdt)
    rng = random.Random(B)
    slots = torch.tensor(rng.sample(range(B + 3), B), dtype=torch.int32)
    rows = torch.tensor(rng.sample(range(B + 2), B), dtype=torch.int32)
    buf = torch.full((B + 2, T, HVm, V, K), float("nan"), dtype=sdt)
    scale = K ** -0.5 * 0.9
    ref = gdn_reference(q.view(B, T, Hm, K), k.view(B, T, Hm, K), v.view(B, T, HVm, V), A_log, a.view(B, T, HVm),
                        dtb.double(), b.view(B, T, HVm), pool.double(), scale=scale, read_indices=slots.long(),
                        intermediate=torch.zeros(B, T, HVm, V, K, dtype=F64), disable_state_update=True)
    qd, kd, vd, ad, bd, Ad, dd, pd, bufd, sd_, rd = _cuda(q, k, v, a, b, A_log, dtb, pool, buf, slots, rows)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=DEV)

    def call():
        return sglang.fused_sigmoid_gating_delta_rule_update(
            A_log=Ad, a=ad, dt_bias=dd, softplus_beta=1.0, softplus_threshold=20.0, q=qd, k=kd, v=vd, b=bd,
            initial_state_source=pd, initial_state_indices=sd_, scale=scale, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu, disable_state_update=True, intermediate_states_buffer=bufd, intermediate_state_indices=rd,
            cache_steps=T)

    o = call()
    torch.cuda.synchronize()
    otol, stol = _tol(sdt)
    assert torch.equal(pd.cpu(), pool)
    assert _rel(o.cpu().view(B, T, HVm, V), ref.output) < otol
    got = bufd.cpu()
    unused = [r for r in range(B + 2) if r not in set(rows.tolist())]
    assert torch.isnan(got[unused].float()).all()
    assert _rel(got[rows.long()], ref.intermediate.to(sdt).double()) < stol
    first_out, first_buf = o.clone(), bufd.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    bufd.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    used = rows.long().to(DEV)
    assert torch.equal(out, first_out) and torch.equal(bufd[used], first_buf[used])


@pytest.mark.parametrize("stage", [None, "unstaged"])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, update", [(4, False), (8, False), (3, True)])
def test_sglang_cache_ring_verify_then_commit(T, update, sdt, stage):
    """SGLang's ReplaySSM ring verify (cache_ring=True, varlen, rings of 2T tokens as per-layer views of a 2-layer
    pool): outputs against the float64 oracle, each live token's raw v / k bits, log decay and beta at its position
    of its slot's rings, nothing else written (a padding request, an empty one, positions >= its length); then
    gdnjit's commit of random accepted prefixes (0..len) from those rings equals the oracle's state after them."""
    N, layer, L = 7, 1, 2 * T
    rng = random.Random(T * 100 + update)
    lens = [T] * N
    lens[2], lens[4] = 0, rng.randint(1, T)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    q, k, v, a, b, A_log, dtb, pool = _inputs(cu[-1], sdt, 70 + T)
    slots = torch.tensor(rng.sample(range(1, 64), N), dtype=torch.int32)
    slots[5] = -1  # padding: computed from zeros, nothing stored
    nan = float("nan")
    rings = (torch.full((2, 64, HV, L, V), nan, dtype=torch.bfloat16), torch.full((2, 64, H, L, K), nan, dtype=torch.bfloat16),
             torch.full((2, 64, HV, L), nan), torch.full((2, 64, HV, L), nan))
    rd = _cuda(*rings)
    qd, kd, vd, ad, bd, Ad, dd, pd = _cuda(q, k, v, a, b, A_log, dtb, pool)
    with _staging(stage):
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, pd, slots.to(DEV), use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEV), disable_state_update=not update,
            cache_ring=True, replayssm_rawv=rd[0][layer], replayssm_rawk=rd[1][layer], replayssm_g=rd[2][layer],
            replayssm_beta=rd[3][layer])
        torch.cuda.synchronize()
    exp_out = torch.zeros(1, cu[-1], HV, V, dtype=F64)
    states = {}  # (request, tokens run) -> the oracle's state
    for n in range(N):
        S_ = pool[int(slots[n])].double() if slots[n] >= 0 else torch.zeros(HV, V, K, dtype=F64)
        states[n, 0] = S_
        for t in range(lens[n]):
            tok = cu[n] + t
            exp_out[0, tok], S_ = _token(q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dtb, S_)
            states[n, t + 1] = S_
    otol, stol = _tol(sdt)
    assert _rel(o.cpu().reshape(exp_out.shape), exp_out) < otol
    got = [x.cpu() for x in rd]
    written = torch.zeros(2, 64, L, dtype=torch.bool)
    g_all = -torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dtb)
    for n in range(N):
        s = int(slots[n])
        for t in range(lens[n] if s >= 0 else 0):
            tok = cu[n] + t
            written[layer, s, t] = True
            assert torch.equal(got[0][layer, s, :, t], v[0, tok]) and torch.equal(got[1][layer, s, :, t], k[0, tok])
            assert torch.allclose(got[2][layer, s, :, t], g_all[tok], rtol=1e-5, atol=1e-5)
            assert torch.allclose(got[3][layer, s, :, t], torch.sigmoid(b[tok].float()), rtol=1e-5, atol=1e-6)
    for x in got:
        assert torch.isnan(x.movedim(3, 2)[~written].float()).all()  # [layers, slots, L, ..]: nothing else written
    live = [n for n in range(N) if slots[n] >= 0]
    if update:  # the state after each live request's last token written to its slot
        assert _rel(pd.cpu()[slots[live].long()], torch.stack([states[n, lens[n]] for n in live])) < stol
        return
    assert torch.equal(pd.cpu(), pool)
    acc = torch.tensor([rng.randint(0, lens[n]) for n in range(N)], dtype=torch.int32)
    for x in rd:  # layer 0 verified the same tokens: both layers' checkpoints commit alike (one launch for all layers)
        x[0].copy_(x[layer])
    ck = torch.stack([pool, pool]).to(DEV)
    gdnjit.gated_delta_rule_replayssm_commit(ck, *rd, slots.to(DEV), acc.to(DEV))
    torch.cuda.synchronize()
    want = torch.stack([states[n, int(acc[n])] for n in live])
    for lay in range(2):
        assert _rel(ck[lay].cpu()[slots[live].long()], want) < stol
    others = [s for s in range(64) if s not in slots[live].tolist()]
    assert torch.equal(ck.cpu()[:, others], torch.stack([pool, pool])[:, others])


@pytest.mark.parametrize("how", ["graph", "compile"])
def test_sglang_cache_ring_captured_and_compiled(how):
    """SGLang's ring verify then gdnjit's commit, as one step: captured in a CUDA graph (replayed with new drafts
    copied in) or under torch.compile(fullgraph=True) (the verify runs as the engine_step op), against the same step
    run eagerly on copies: outputs, rings and committed checkpoints bit for bit."""
    N, T, L = 24, 4, 8
    q, k, v, a, b, A_log, dtb, pool = _inputs(N * T, torch.float32, 61)
    slots = torch.tensor(random.Random(5).sample(range(1, 64), N), dtype=torch.int32)
    slots[3] = -1
    acc = torch.tensor([random.Random(6).randint(0, T) for _ in range(N)], dtype=torch.int32)
    rings = (torch.zeros(1, 64, HV, L, V, dtype=torch.bfloat16), torch.zeros(1, 64, H, L, K, dtype=torch.bfloat16),
             torch.zeros(1, 64, HV, L), torch.zeros(1, 64, HV, L))
    bufs = _cuda(q, k, v, a, b, A_log, dtb, pool, slots, acc, torch.arange(0, N * T + 1, T, dtype=torch.int32), *rings)
    qd, kd, vd, ad, bd, Ad, dd, pd, sd, accd, cud, *rd = bufs
    ck = pd[None].clone()

    def step(qd, kd, vd, ck, rv, rk, g, beta):
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            Ad, ad, dd, 1.0, 20.0, qd, kd, vd, bd, ck[0], sd, use_qk_l2norm_in_kernel=True, cu_seqlens=cud,
            disable_state_update=True, cache_ring=True, replayssm_rawv=rv[0], replayssm_rawk=rk[0], replayssm_g=g[0],
            replayssm_beta=beta[0])
        gdnjit.torch_ops.gated_delta_rule_replayssm_commit(ck, rv, rk, g, beta, sd, accd)
        return o

    q2, k2, v2, *_ = _cuda(*_inputs(N * T, torch.float32, 62)[:3])
    if how == "graph":
        step(qd, kd, vd, ck.clone(), *(x.clone() for x in rd))  # warm-up (compiles) outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(qd, kd, vd, ck, *rd)
        for dst, src in ((qd, q2), (kd, k2), (vd, v2)):
            dst.copy_(src)
        graph.replay()
        got = (out, ck, *rd)
    else:
        torch._dynamo.reset()
        got = (torch.compile(step, fullgraph=True)(q2, k2, v2, ck, *rd), ck, *rd)
    ck_e, rd_e = pd[None].clone(), [torch.zeros_like(x) for x in rd]
    out_e = step(q2, k2, v2, ck_e, *rd_e)
    torch.cuda.synchronize()
    for x, y in zip(got, (out_e, ck_e, *rd_e)):
        assert torch.equal(x, y)
    assert not torch.equal(ck_e, pd[None])  # something was committed
