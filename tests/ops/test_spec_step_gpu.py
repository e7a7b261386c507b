"""gdnjit's fused speculative step on the GPU (issue 26): multi-step loops against the float64 reference
(outputs, checkpoints, both cache halves, the control words), padding rows and pools with gaps, page-strided pools,
vLLM's null block, every K / V, both state dtypes, T 1..8, accept counts 0..T, the flush, a captured multi-step
loop, and the ground truth: plain T = 1 decoding of the accepted token stream."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

import gdnjit
from gdnjit.reference.spec_step import spec_step_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"
bf = torch.bfloat16


def _rel(x, ref):
    return (x.double().cpu() - ref.double().cpu()).abs().max().item() / max(ref.double().abs().max().item(), 1e-6)


def _tokens(B, T, H, HV, K, V, g):
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    return r(B, T, H, K).to(bf), r(B, T, H, K).to(bf), r(B, T, HV, V).to(bf), r(B, T, HV).to(bf), r(B, T, HV).to(bf)


def _gates(HV, g):
    return torch.rand(HV, device=DEV, generator=g), torch.randn(HV, device=DEV, generator=g)


def _poisoned_cache(slots, H, HV, T, K, V):
    c = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=DEV)
    for x in c[:4]:
        x.fill_(float("nan"))
    return c


def _check_cache(cache, ref_cache, live_slots, what):
    ck, cv, cg, cb, ctl = ref_cache
    assert torch.equal(cache.ctl.cpu(), ctl), f"{what}: ctl"
    for s in live_slots:
        h = int(ctl[s, 0])  # the half this step wrote
        assert torch.equal(cache.k[s, h].cpu(), ck[s, h]), f"{what}: cache.k slot {s}"
        assert torch.equal(cache.v[s, h].cpu(), cv[s, h]), f"{what}: cache.v slot {s}"
        assert torch.allclose(cache.g[s, h].cpu().double(), cg[s, h].double(), rtol=1e-5, atol=1e-6), what
        assert torch.allclose(cache.beta[s, h].cpu().double(), cb[s, h].double(), rtol=1e-6, atol=1e-7), what


def _state_tol(sdt):
    return 2e-3 if sdt == torch.float32 else 2e-2


# the two kernel forms of the step, forced: the CUDA-core recurrent loop and the tc form's two chunks of bf16 MMAs
# (bf16 q/k, K = 128, T 2..8); the rules pick tc where it runs
RECURRENT = {"form": "recurrent", "lanes_per_row": 8, "ilp": 2, "tile_v": 16, "stage": False, "pipe": 1}
TC = {"form": "tc"}
TC128 = {"form": "tc", "tile_v": 128}  # a bf16 state's 128-row tiles: two 64-row blocks per warp


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 4, 8])
@pytest.mark.parametrize("K,V", [(128, 128), (64, 64), (256, 128), (128, 256)])
@pytest.mark.parametrize("null", [-1, 0])
@pytest.mark.parametrize("form", ["rule", "recurrent"])
def test_loop_matches_the_reference(K, V, T, sdt, null, form):
    """Four steps over a pool with gaps: the first with nothing accepted, then random accept counts 0..T; padding
    rows (slot -1, or vLLM's null block 0) touch nothing; every output, checkpoint, cache half and control word.
    rule: the variant the dispatcher picks (tc where it runs); recurrent: that form forced."""
    if form == "recurrent" and not (K == 128 and T > 1):
        pytest.skip("the rule already runs the recurrent form here")
    _loop(K, V, T, sdt, null, [RECURRENT if form == "recurrent" else None] * 4)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [2, 3, 4, 5, 8])  # (4: bf16 state at 7 CTAs per SM, its own register budget)
@pytest.mark.parametrize("V", [128, 256])
@pytest.mark.parametrize("forms", ["tc", "tc128", "mixed"])
def test_tc_form_loop_matches_the_reference(V, T, sdt, forms):
    """The tc form forced over its domain (odd T: a lane's second token slot empty; tc128: a bf16 state's 128-row
    tiles), and steps alternating between the forms: a step replays what the other form cached (the cache contents
    are the same bits either way)."""
    if forms == "tc128" and sdt != bf:
        pytest.skip("128-row tiles: bf16 state only")
    steps = {"tc": [TC] * 4, "tc128": [TC128] * 4, "mixed": [TC, RECURRENT, TC128 if sdt == bf else TC, RECURRENT]}[forms]
    _loop(128, V, T, sdt, -1, steps)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["rule", "recurrent", "tc"])
def test_null_block_above_zero(sdt, form):
    """null_block_id 3 (any int >= -1, as FlashInfer's commit): rows on slots 0..3 are padding, those slots untouched."""
    _loop(128, 128, 4, sdt, 3, [{"rule": None, "recurrent": RECURRENT, "tc": TC}[form]] * 4)


def _loop(K, V, T, sdt, null, forms):
    from gdn_cases import forcing

    H, HV, B = 2, 8 if K * V <= 128 * 128 else 4, 7
    g = torch.Generator(device=DEV).manual_seed(K * 7 + V + T * 3 + int(sdt == bf) + 11 * null)
    rng = random.Random(K + V + T + null)
    slots = 3 * B + 2
    pool = (torch.randn(slots, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    cache = _poisoned_cache(slots, H, HV, T, K, V)
    A_log, dtb = _gates(HV, g)
    chosen = rng.sample(range(1, slots), B)  # slot 0 stays out of use (vLLM's null block when null == 0)
    idx = torch.tensor(chosen, dtype=torch.int32, device=DEV)
    idx[2] = null if null >= 0 else -1
    idx[5] = -1
    live = [int(s) for s in idx.tolist() if s > null]
    acc = torch.zeros(B, dtype=torch.int32, device=DEV)
    for step in range(4):
        q, k, v, a, b = _tokens(B, T, H, HV, K, V, g)
        ref = spec_step_reference(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache, null_block_id=null)
        pool_before = pool.clone()
        with (forcing(forms[step]) if forms[step] else contextlib.nullcontext()):
            out = gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache,
                                                    null_block_id=null)
            torch.cuda.synchronize()
        what = f"step {step} T={T} K={K} V={V} {sdt} null={null} forced={forms[step]}"
        assert _rel(out.float(), ref.output) < 2e-2, what
        assert (out[[2, 5]] == 0).all(), f"{what}: padding rows' outputs"
        assert _rel(pool.float(), ref.state.float()) < _state_tol(sdt), what
        untouched = [s for s in range(slots) if s not in live]
        assert torch.equal(pool[untouched], pool_before[untouched]), f"{what}: a slot no request owns was written"
        _check_cache(cache, ref.cache, live, what)
        acc = torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=torch.int32, device=DEV)
    # padding rows never touched their slots' caches (the null block's / slot 0's halves stay poisoned)
    assert torch.isnan(cache.g[0].float()).all() and int(cache.ctl[0].abs().sum()) == 0


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_page_strided_pool_and_given_output(sdt):
    """A pool whose slots are pages of a bigger allocation (slot pitch > one slot's block), int64 indices, a given
    fp32 output whose padding rows are left as they were."""
    H, HV, K, V, T, B, slots = 4, 16, 128, 128, 4, 6, 10
    g = torch.Generator(device=DEV).manual_seed(5)
    pages = (torch.randn(slots, 3, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    pool = pages[:, 1]
    assert pool.stride(0) == 3 * HV * V * K
    cache = _poisoned_cache(slots, H, HV, T, K, V)
    A_log, dtb = _gates(HV, g)
    idx = torch.tensor([7, 2, -1, 9, 0, 4], dtype=torch.int64, device=DEV)
    acc = torch.zeros(B, dtype=torch.int32, device=DEV)
    other = pages[:, [0, 2]].clone()
    for step in range(3):
        q, k, v, a, b = _tokens(B, T, H, HV, K, V, g)
        ref = spec_step_reference(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache)
        out = torch.full((B, T, HV, V), 7.0, device=DEV)
        gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache, output=out)
        torch.cuda.synchronize()
        live = [0, 1, 3, 4, 5]
        assert _rel(out[live].float(), ref.output[live]) < (5e-3 if sdt == torch.float32 else 2e-2)
        assert (out[2] == 7.0).all(), "a given output's padding row was written"
        assert _rel(pool.float(), ref.state.float()) < _state_tol(sdt)
        assert torch.equal(pages[:, [0, 2]], other), "the pages' other parts were written"
        _check_cache(cache, ref.cache, [7, 2, 9, 0, 4], f"step {step}")
        acc = torch.tensor([1, 4, 3, 2, 0, 3], dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 33, 130])
def test_flush_matches_the_reference(B, sdt):
    H, HV, K, V, T = 2, 8, 128, 128, 5
    g = torch.Generator(device=DEV).manual_seed(B)
    slots = B + 3
    pool = (torch.randn(slots, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    cache = _poisoned_cache(slots, H, HV, T, K, V)
    A_log, dtb = _gates(HV, g)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(torch.int32)
    if B > 1:
        idx[B // 2] = -1
    acc = torch.zeros(B, dtype=torch.int32, device=DEV)
    q, k, v, a, b = _tokens(B, T, H, HV, K, V, g)
    gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache)
    acc = torch.randint(0, T + 1, (B,), device=DEV, generator=g, dtype=torch.int32)
    ref = spec_step_reference(None, None, None, None, None, None, None, pool, idx, acc, cache, flush=True)
    ctl = cache.ctl.clone()
    gdnjit.gated_delta_rule_spec_flush(pool, idx, acc, cache)
    torch.cuda.synchronize()
    assert _rel(pool.float(), ref.state.float()) < _state_tol(sdt)
    assert torch.equal(cache.ctl, ctl), "a flush does not flip the halves"


def test_captured_multi_step_loop_matches_eager():
    """A CUDA graph of three whole steps (every layer), replayed twice with new inputs copied in, gives the bits of the
    same steps run eagerly on a copy of the pool and caches."""
    L, H, HV, K, V, T, B, slots = 2, 4, 16, 128, 128, 4, 12, 20
    g = torch.Generator(device=DEV).manual_seed(9)
    pool = [(torch.randn(slots, HV, V, K, device=DEV, generator=g) * 0.1) for _ in range(L)]
    cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=DEV, layers=L)
    for x in cache[:4]:  # the warm-up's first step may replay (random counts): defined values, no NaN states
        x.zero_()
    A_log, dtb = _gates(HV, g)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(torch.int32)
    idx[3] = -1
    steps = 3
    inputs = [[torch.zeros_like(x) for x in _tokens(B, T, H, HV, K, V, g)] for _ in range(steps)]
    accs = [torch.zeros(B, dtype=torch.int32, device=DEV) for _ in range(steps)]
    # zeroed: the padding row's outputs are never written (a given output's padding rows are left as they were)
    outs = [[torch.zeros(B, T, HV, V, dtype=bf, device=DEV) for _ in range(L)] for _ in range(steps)]

    def loop(pool, cache):
        for s in range(steps):
            for layer in range(L):
                gdnjit.gated_delta_rule_spec_step(*inputs[s][:3], A_log, inputs[s][3], dtb, inputs[s][4], pool[layer],
                                                  idx, accs[s], cache.layer(layer), output=outs[s][layer])

    def fill(seed):
        gg = torch.Generator(device=DEV).manual_seed(seed)
        for s in range(steps):
            for dst, src in zip(inputs[s], _tokens(B, T, H, HV, K, V, gg)):
                dst.copy_(src)
            accs[s].copy_(torch.randint(0, T + 1, (B,), device=DEV, generator=gg, dtype=torch.int32))

    fill(1)
    loop(pool, cache)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loop(pool, cache)
    for seed in (2, 3):
        fill(seed)
        pool_e = [p.clone() for p in pool]
        cache_e = gdnjit.SpecCache(*(x.clone() for x in cache))
        loop(pool_e, cache_e)
        eager = [[o.clone() for o in step] for step in outs]
        graph.replay()
        torch.cuda.synchronize()
        for s in range(steps):
            for layer in range(L):
                assert torch.equal(outs[s][layer], eager[s][layer]), f"seed {seed} step {s} layer {layer}"
        for layer in range(L):
            assert torch.equal(pool[layer], pool_e[layer])
        assert torch.equal(cache.ctl, cache_e.ctl)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [2, 4, 8])
def test_ground_truth_plain_decoding_of_the_accepted_stream(T, sdt):
    """The serving loop's ground truth: the outputs of the accepted tokens and the final state (after a flush) are
    those of plain T = 1 decoding of the accepted token stream, within tolerance (bf16 state: the fused step rounds
    the checkpoint once per step, plain decoding after every token)."""
    H, HV, K, V, B = 4, 16, 128, 128, 9
    g = torch.Generator(device=DEV).manual_seed(T + 100 * int(sdt == bf))
    rng = random.Random(T)
    slots = B + 4
    pool0 = (torch.randn(slots, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    pool, plain = pool0.clone(), pool0.clone()
    cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=DEV)
    A_log, dtb = _gates(HV, g)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(torch.int32)
    acc = torch.zeros(B, dtype=torch.int32, device=DEV)
    worst = 0.0
    for step in range(6):
        q, k, v, a, b = _tokens(B, T, H, HV, K, V, g)
        out = gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache)
        acc = torch.tensor([rng.randint(1, T) for _ in range(B)], dtype=torch.int32, device=DEV)
        # plain decoding of the accepted tokens, one at a time per request (row by row, each its own pool slot)
        for t in range(T):
            rows = (acc > t).nonzero().flatten()
            if rows.numel() == 0:
                break
            sl = lambda x: x[rows, t:t + 1].contiguous()  # noqa: E731
            o, _ = gdnjit.gated_delta_rule_mtp(sl(q), sl(k), sl(v), plain, idx[rows], A_log, sl(a), dtb, sl(b),
                                               disable_state_update=False)
            worst = max(worst, _rel(out[rows, t:t + 1].float(), o.float()))
    gdnjit.gated_delta_rule_spec_flush(pool, idx, acc, cache)
    torch.cuda.synchronize()
    tol = 5e-3 if sdt == torch.float32 else 5e-2
    assert worst < tol, f"accepted outputs vs plain decoding: {worst}"
    assert _rel(pool[idx.long()].float(), plain[idx.long()].float()) < tol
