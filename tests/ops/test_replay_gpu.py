"""FlashInfer's ReplaySSM path on the GPU (issue 26): verify caching each token's raw inputs at its slot
(``gated_delta_rule_mtp(cache_replayssm=True, ...)``), the commit replaying the accepted prefix into the checkpoint
(``gated_delta_rule_replayssm_commit``), against the float64 references; the pair against plain decoding of the
accepted tokens; a captured verify + commit loop. "tc": the tc form forced (bf16 q/k, K = 128, T 2..8; the commit
without track), which the rules pick at mid / large batches."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

import gdnjit
from gdnjit.reference.gdn import gates as ref_gates
from gdnjit.reference.gdn import gdn_reference
from gdnjit.reference.replay import replay_commit_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"
bf = torch.bfloat16


TC = {"form": "tc"}
TC128 = {"form": "tc", "tile_v": 128}  # a bf16 state's 128-row tiles: two 64-row blocks per warp


def _form(form):
    from gdn_cases import forcing

    return forcing(TC) if form == "tc" else forcing(TC128) if form == "tc128" else contextlib.nullcontext()


def _rel(x, ref):
    return (x.double() - ref.double()).abs().max().item() / max(ref.double().abs().max().item(), 1e-6)


def _inputs(N, T, H, HV, K, V, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    return (r(N, T, H, K).to(bf), r(N, T, H, K).to(bf), r(N, T, HV, V).to(bf), torch.rand(HV, device=DEV, generator=g),
            r(N, T, HV).to(bf), r(HV), r(N, T, HV).to(bf))


def _caches(slots, H, HV, T, K, V):
    nan = float("nan")
    return (torch.full((slots, HV, T, V), nan, device=DEV, dtype=bf), torch.full((slots, H, T, K), nan, device=DEV, dtype=bf),
            torch.full((slots, HV, T), nan, device=DEV), torch.full((slots, HV, T), nan, device=DEV))


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("N", [1, 5, 64])
@pytest.mark.parametrize("form", ["rule", "tc"])
def test_verify_caches_raw_inputs_at_the_read_slot(N, T, sdt, form):
    if form == "tc" and T < 2:
        pytest.skip("the tc form runs T 2..8")
    H, HV, K, V = 4, 16, 128, 128
    q, k, v, A_log, a, dtb, b = _inputs(N, T, H, HV, K, V, N * 10 + T)
    slots = 2 * N + 2
    pool = (torch.randn(slots, HV, V, K, device=DEV) * 0.1).to(sdt)
    idx = torch.tensor(random.Random(N + T).sample(range(slots), N), dtype=torch.int32, device=DEV)
    if N > 1:
        idx[1] = -1  # padding: nothing cached
    rawv, rawk, gc, bc = _caches(slots, H, HV, T, K, V)
    p0 = pool.clone()
    with _form(form):
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, disable_state_update=True,
                                             cache_replayssm=True, replayssm_rawv=rawv, replayssm_rawk=rawk,
                                             replayssm_g=gc, replayssm_beta=bc)
        torch.cuda.synchronize()
    assert torch.equal(pool, p0)
    ref = gdn_reference(q, k, v, A_log, a, dtb, b, p0, read_indices=idx, disable_state_update=True)
    assert _rel(out.float(), ref.output) < 2e-2
    g_ref, beta_ref = ref_gates(a, b, A_log, dtb)
    live = [n for n in range(N) if int(idx[n]) >= 0]
    for n in live:
        s = int(idx[n])
        assert torch.equal(rawk[s], k[n].transpose(0, 1)) and torch.equal(rawv[s], v[n].transpose(0, 1))
        assert torch.allclose(gc[s].double(), torch.log(g_ref[n]).transpose(0, 1), rtol=1e-5, atol=1e-6)
        assert torch.allclose(bc[s].double(), beta_ref[n].transpose(0, 1), rtol=1e-6, atol=1e-7)
    untouched = [s for s in range(slots) if s not in {int(idx[n]) for n in live}]
    assert torch.isnan(rawk[untouched].float()).all() and torch.isnan(gc[untouched]).all()


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K,V", [(128, 128), (64, 64), (256, 128), (128, 256)])
@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("null", [-1, 0, 3])  # 3: FlashInfer's null_block_id is any int >= -1 (slots 1..3 skipped)
@pytest.mark.parametrize("form", ["rule", "tc", "tc128"])
def test_commit_matches_the_reference(K, V, sdt, track, null, form):
    if form != "rule" and (K != 128 or track):
        pytest.skip("the tc form's commit: K = 128, without track")
    if form == "tc128" and sdt != bf:
        pytest.skip("128-row tiles: bf16 state only")
    L, S, H, HV, T, B = 2, 24, 4, 8, 6, 9
    g = torch.Generator(device=DEV).manual_seed(K + V + int(track) + 3 * null)
    ck = (torch.randn(L, S, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    rawv = torch.randn(L, S, HV, T, V, device=DEV, generator=g).to(bf)
    rawk = torch.randn(L, S, H, T, K, device=DEV, generator=g).to(bf)
    gc = -torch.rand(L, S, HV, T, device=DEV, generator=g) * 2
    bc = torch.rand(L, S, HV, T, device=DEV, generator=g)
    rng = random.Random(K * V)
    idx = torch.tensor(rng.sample(range(1, S), B), dtype=torch.int32)
    idx[2] = null  # the null block / padding
    acc = torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=torch.int32)
    acc[0], acc[1] = 0, T
    kw = {}
    if track:
        free = [s for s in range(1, S) if s not in set(idx.tolist())]
        kw = dict(track_state_indices=torch.tensor(free[:B], dtype=torch.int32).to(DEV),
                  track_steps=torch.tensor([rng.randint(0, T - 1) for _ in range(B)], dtype=torch.int32).to(DEV))
    expect = replay_commit_reference(ck, rawv, rawk, gc, bc, idx, acc, null_block_id=null,
                                     **{n: x.cpu() for n, x in kw.items()})
    got = ck.clone()
    with _form(form):
        gdnjit.gated_delta_rule_replayssm_commit(got, rawv, rawk, gc, bc, idx.to(DEV), acc.to(DEV), null_block_id=null,
                                                 **kw)
        torch.cuda.synchronize()
    changed = (expect.to(sdt) != ck).flatten(2).any(-1)  # [L, S]: slots the reference wrote
    assert torch.equal(got[~changed], ck[~changed])
    assert _rel(got[changed], expect[changed]) < (2e-3 if sdt == torch.float32 else 1e-2)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [2, 3, 4, 8])
@pytest.mark.parametrize("form", ["rule", "tc"])
def test_verify_then_commit_is_decoding_the_accepted_tokens(T, sdt, form):
    """A speculative step the FlashInfer way: frozen verify with the cache, then the commit of accept_lens tokens;
    the checkpoint equals the state after plainly decoding those tokens, the verify outputs the decode's."""
    if form == "tc" and T < 2:
        pytest.skip("the tc form runs T 2..8")
    N, H, HV, K, V = 32, 4, 16, 128, 128
    q, k, v, A_log, a, dtb, b = _inputs(N, T, H, HV, K, V, 7 * T)
    slots = N + 3
    pool = (torch.randn(slots, HV, V, K, device=DEV) * 0.1).to(sdt)
    idx = torch.randperm(slots, device=DEV)[:N].to(torch.int32)
    acc = torch.randint(1, T + 1, (N,), dtype=torch.int32)
    rawv, rawk, gc, bc = _caches(slots, H, HV, T, K, V)
    p0 = pool.clone()
    with _form(form):
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, disable_state_update=True,
                                             cache_replayssm=True, replayssm_rawv=rawv, replayssm_rawk=rawk,
                                             replayssm_g=gc, replayssm_beta=bc)
        gdnjit.gated_delta_rule_replayssm_commit(pool[None], rawv[None], rawk[None], gc[None], bc[None], idx,
                                                 acc.to(DEV))
        torch.cuda.synchronize()
    for n in range(N):
        m = int(acc[n])
        ref = gdn_reference(q[n:n + 1, :m], k[n:n + 1, :m], v[n:n + 1, :m], A_log, a[n:n + 1, :m], dtb, b[n:n + 1, :m],
                            p0[int(idx[n])][None])
        assert _rel(out[n, :m].float(), ref.output[0]) < 2e-2
        assert _rel(pool[int(idx[n])], ref.state[0]) < (2e-3 if sdt == torch.float32 else 1e-2)


def test_captured_verify_and_commit_loop():
    """Three speculative steps captured once in a CUDA graph: replays with new drafts and accept counts copied in
    give the eager results bit for bit."""
    N, T, H, HV, K, V = 16, 4, 4, 16, 128, 128
    q, k, v, A_log, a, dtb, b = _inputs(N, T, H, HV, K, V, 99)
    pool0 = torch.randn(N, HV, V, K, device=DEV) * 0.1
    idx = torch.arange(N, dtype=torch.int32, device=DEV)
    acc = torch.full((N,), 2, dtype=torch.int32, device=DEV)
    caches = _caches(N, H, HV, T, K, V)
    pool = pool0.clone()

    def step():
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, disable_state_update=True,
                                             cache_replayssm=True, replayssm_rawv=caches[0], replayssm_rawk=caches[1],
                                             replayssm_g=caches[2], replayssm_beta=caches[3])
        gdnjit.gated_delta_rule_replayssm_commit(pool[None], *(c[None] for c in caches), idx, acc)
        return out
    step()
    pool.copy_(pool0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [step() for _ in range(3)]
    q2, k2, v2, _, a2, _, b2 = _inputs(N, T, H, HV, K, V, 100)
    for dst, src in ((q, q2), (k, k2), (v, v2), (a, a2), (b, b2)):
        dst.copy_(src)
    acc.copy_(torch.randint(1, T + 1, (N,), dtype=torch.int32))
    pool.copy_(pool0)
    graph.replay()
    torch.cuda.synchronize()
    got_out, got_pool = [o.clone() for o in outs], pool.clone()
    pool.copy_(pool0)
    ref_out = [step().clone() for _ in range(3)]
    torch.cuda.synchronize()
    assert all(torch.equal(x, y) for x, y in zip(got_out, ref_out)) and torch.equal(got_pool, pool)


@pytest.mark.parametrize("T", [3, 8])
def test_verify_fp16_inputs_cache_bf16_as_flashinfer(T):
    """FlashInfer's caches are bf16 whatever q's dtype: fp16 raw k / v are rounded to bf16 when cached (bit for bit
    torch's rounding), the outputs use the fp16 values; output_state_indices is accepted and writes nothing; padding
    rows leave their rows of the given output; fp16 caches are refused with a DtypeError (a ValueError too)."""
    N, H, HV, K, V = 6, 2, 8, 128, 128
    q, k, v, A_log, a, dtb, b = (x.to(torch.float16) if x.dtype == bf else x for x in _inputs(N, T, H, HV, K, V, 5 + T))
    slots = N + 2
    pool = torch.randn(slots, HV, V, K, device=DEV) * 0.1
    idx = torch.arange(N, dtype=torch.int32, device=DEV)
    idx[2] = -1
    rawv, rawk, gc, bc = _caches(slots, H, HV, T, K, V)
    out = torch.full((N, T, HV, V), 3.0, device=DEV, dtype=torch.float16)
    p0 = pool.clone()
    got, state = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, output=out, disable_state_update=True,
                                             output_state_indices=idx.clone(), cache_replayssm=True, replayssm_rawv=rawv,
                                             replayssm_rawk=rawk, replayssm_g=gc, replayssm_beta=bc)
    torch.cuda.synchronize()
    assert got is out and state is pool and torch.equal(pool, p0)
    ref = gdn_reference(q, k, v, A_log, a, dtb, b, p0, read_indices=idx, disable_state_update=True)
    live = [n for n in range(N) if n != 2]
    assert _rel(out[live].float(), ref.output[live]) < 2e-2
    assert torch.equal(out[2], torch.full_like(out[2], 3.0))
    for n in live:
        assert torch.equal(rawk[n], k[n].transpose(0, 1).to(bf)) and torch.equal(rawv[n], v[n].transpose(0, 1).to(bf))
    assert torch.isnan(rawv[2].float()).all() and torch.isnan(gc[2]).all()
    with pytest.raises(ValueError, match="replayssm_rawv: expected dtype bfloat16, got float16"):
        gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, disable_state_update=True, cache_replayssm=True,
                                    replayssm_rawv=rawv.half(), replayssm_rawk=rawk, replayssm_g=gc, replayssm_beta=bc)
