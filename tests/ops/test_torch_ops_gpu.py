"""The torch custom ops on the GPU (run on the device: pytest -m gpu tests/ops/test_torch_ops_gpu.py).

* torch.compile(fullgraph=True) of functions calling each op gives bit-identical results to the eager
  functions (same kernels), and matches the float64 reference (the fused speculative step: against its eager
  function over two steps);
* a CUDA graph of a whole decode step (projection -> GDN decode over a pool -> norm -> projection ->
  NVFP4 quantize) replays correctly with new inputs copied in, compared to eager;
* every visible GPU: the ops run on cuda:d while the current device is another one.
"""

from __future__ import annotations

import pytest
import torch

import gdnjit
import gdnjit.torch_ops as ops
from gdnjit.reference.gdn import gdn_reference
from gdnjit.reference.nvfp4 import quantize_reference

pytestmark = pytest.mark.gpu


def inputs(B, T, H, HV, K=128, V=128, n_slots=None, layout="klast", device="cuda", seed=0, state_dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    trailing = (HV, V, K) if layout == "klast" else (HV, K, V)
    return dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V), a=rnd(B, T, HV), b=rnd(B, T, HV),
                A_log=torch.log(torch.rand(HV, generator=g, device=device) * 15 + 1),
                dt_bias=rnd(HV, dtype=torch.float32), state=rnd(n_slots or B, *trailing, dtype=state_dtype, scale=0.5))


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def gates(t):
    return dict(A_log=t["A_log"], a=t["a"], dt_bias=t["dt_bias"], b=t["b"])


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True)


# ---- torch.compile(fullgraph=True) -------------------------------------------------------------------

@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_compile_decode_pretranspose_pool(state_dtype):
    B, H, HV = 6, 2, 8
    t = inputs(B, 1, H, HV, n_slots=11, state_dtype=state_dtype)
    idx = torch.tensor([9, -1, 0, 4, 10, 2], device="cuda", dtype=torch.int32)

    def step(q, k, v, a, b, pool, idx):
        out, pool = ops.gated_delta_rule_decode_pretranspose(q, k, v, None, t["A_log"], a, t["dt_bias"], b,
                                                             initial_state=pool, initial_state_indices=idx)
        return out.float() * 0.5

    fn = compiled(step)
    for it in range(3):  # new inputs each call: the compiled graph is reused
        q, k, v, a, b = (torch.randn_like(t[n]) for n in "qkvab")
        pool = t["state"].clone()
        pool_eager = pool.clone()
        got = fn(q, k, v, a, b, pool, idx)
        out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, t["A_log"], a, t["dt_bias"], b,
                                                             initial_state=pool_eager, initial_state_indices=idx)
        torch.cuda.synchronize()
        assert torch.equal(got, out.float() * 0.5), it
        assert torch.equal(pool, pool_eager), it
        ref = gdn_reference(q, k, v, t["A_log"], a, t["dt_bias"], b, t["state"].double(), read_indices=idx)
        assert rel(got * 2, ref.output.to(torch.bfloat16)) < (1e-3 if state_dtype == torch.float32 else 8e-3)
        assert (got[1] == 0).all()


def test_compile_mtp_verify_with_buffer():
    B, T, H, HV = 4, 4, 2, 4
    t = inputs(B, T, H, HV, n_slots=7, seed=1)
    idx = torch.tensor([6, 1, -1, 3], device="cuda", dtype=torch.int64)

    def verify(q, pool, buf, idx):
        out, _ = ops.gated_delta_rule_mtp(q, t["k"], t["v"], pool, idx, **gates(t), intermediate_states_buffer=buf,
                                          disable_state_update=True)
        return out

    pool = t["state"].clone()
    buf = torch.full((B, T + 2, HV, 128, 128), float("nan"), device="cuda")
    buf_eager = buf.clone()
    got = compiled(verify)(t["q"], pool, buf, idx)
    out, _ = gdnjit.gated_delta_rule_mtp(t["q"], t["k"], t["v"], t["state"], idx, **gates(t),
                                         intermediate_states_buffer=buf_eager, disable_state_update=True)
    torch.cuda.synchronize()
    assert torch.equal(got, out)
    assert torch.equal(buf.nan_to_num(7.0), buf_eager.nan_to_num(7.0))
    assert torch.equal(pool, t["state"])  # verify mode: the pool is untouched
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], t["state"].double(),
                        read_indices=idx, intermediate=buf_eager.double(), disable_state_update=True)
    assert rel(got, ref.output.to(torch.bfloat16)) < 1e-3
    live = [0, 1, 3]
    assert rel(buf[live, :T], ref.intermediate[live, :T]) < 1e-3


def test_compile_mtp_replayssm_verify_and_commit():
    """FlashInfer's caching verify through the op (it runs as engine_step) and its commit, compiled: the same bits as
    the eager functions in the outputs, all four caches and the committed checkpoints."""
    B, T, H, HV = 4, 4, 2, 4
    t = inputs(B, T, H, HV, n_slots=7, seed=3)
    idx = torch.tensor([6, 1, -1, 3], device="cuda", dtype=torch.int32)
    nan = float("nan")

    def caches():
        return (torch.full((7, HV, T, 128), nan, device="cuda", dtype=torch.bfloat16),
                torch.full((7, H, T, 128), nan, device="cuda", dtype=torch.bfloat16),
                torch.full((7, HV, T), nan, device="cuda"), torch.full((7, HV, T), nan, device="cuda"))

    acc = torch.tensor([3, 1, 0, 4], device="cuda", dtype=torch.int32)

    def verify(q, pool, rv, rk, g, beta):
        out, _ = ops.gated_delta_rule_mtp(q, t["k"], t["v"], pool, idx, **gates(t), disable_state_update=True,
                                          cache_replayssm=True, replayssm_rawv=rv, replayssm_rawk=rk, replayssm_g=g,
                                          replayssm_beta=beta)
        return out

    def step(q, pool, rv, rk, g, beta):
        out = verify(q, pool, rv, rk, g, beta)
        ops.gated_delta_rule_replayssm_commit(pool[None], rv[None], rk[None], g[None], beta[None], idx, acc)
        return out

    # The verify alone first (it must leave the pool), then verify + commit in one graph. Not one graph with a
    # pool.clone() between the two ops: Inductor (torch 2.11 / 2.13) then returns the clone aliased to the committed
    # pool, with any two custom ops (docs/api.md, torch ops).
    pool_v, c_v = t["state"].clone(), caches()
    got_v = compiled(verify)(t["q"], pool_v, *c_v)
    pool, c_op, c_eager = t["state"].clone(), caches(), caches()
    got = compiled(step)(t["q"], pool, *c_op)
    p_eager = t["state"].clone()
    out, _ = gdnjit.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p_eager, idx, **gates(t), disable_state_update=True,
                                         cache_replayssm=True, replayssm_rawv=c_eager[0], replayssm_rawk=c_eager[1],
                                         replayssm_g=c_eager[2], replayssm_beta=c_eager[3])
    frozen = p_eager.clone()
    gdnjit.gated_delta_rule_replayssm_commit(p_eager[None], *(c[None] for c in c_eager), idx, acc)
    torch.cuda.synchronize()
    assert torch.equal(got, out) and torch.equal(got_v, out)
    assert torch.equal(pool_v, t["state"]) and torch.equal(frozen, t["state"])  # the verify leaves the pool
    for caches_got in (c_op, c_v):
        assert all(torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)) for x, y in zip(caches_got, c_eager))
    assert not torch.isnan(c_op[1][6].float()).any() and torch.isnan(c_op[0][0].float()).all()
    assert torch.equal(pool, p_eager) and not torch.equal(pool[6], t["state"][6])  # committed alike


def test_compile_fused_spec_step_two_steps():
    """gdnjit::spec_step under torch.compile: two whole steps (the second replays what the first cached) give the
    eager function's bits, output, pool and cache, with a padding row."""
    B, T, H, HV, slots = 5, 3, 2, 4, 9
    t = inputs(B, T, H, HV, n_slots=slots, seed=4)
    idx = torch.tensor([7, 2, -1, 0, 5], device="cuda", dtype=torch.int32)

    def step(q, k, v, a, b, pool, acc, cache):
        return ops.spec_step(q, k, v, t["A_log"], a, t["dt_bias"], b, pool, idx, acc, cache).float()

    fn = compiled(step)
    pool, pool_e = t["state"].clone(), t["state"].clone()
    cache = gdnjit.spec_cache(slots, H, HV, T, 128, 128, dtype=torch.bfloat16, device="cuda")
    for x in cache[:4]:  # defined bits in the halves a step does not write (uninitialised memory may hold NaNs)
        x.fill_(3.0)
    cache_e = gdnjit.SpecCache(*(x.clone() for x in cache))
    for acc in ([0] * B, [3, 1, 2, 2, 1]):
        acc = torch.tensor(acc, device="cuda", dtype=torch.int32)
        q, k, v, a, b = (torch.randn_like(t[n]) for n in "qkvab")
        got = fn(q, k, v, a, b, pool, acc, cache)
        out = gdnjit.gated_delta_rule_spec_step(q, k, v, t["A_log"], a, t["dt_bias"], b, pool_e, idx, acc, cache_e)
        torch.cuda.synchronize()
        assert torch.equal(got, out.float()) and (got[2] == 0).all()
        assert torch.equal(pool, pool_e) and torch.equal(cache.ctl, cache_e.ctl)
        live = [7, 2, 0, 5]
        assert torch.equal(cache.k[live], cache_e.k[live]) and torch.equal(cache.g[live], cache_e.g[live])


def test_compile_kmajor_decode_with_output():
    B, T, H, HV = 3, 2, 2, 4
    t = inputs(B, T, H, HV, layout="kmajor", seed=2)

    def decode(state, out):
        ops.gated_delta_rule_decode(t["q"], t["k"], t["v"], state, **gates(t), output=out, scale=0.25)
        return out.sum(dim=-1)

    state, out = t["state"].clone(), torch.empty(B, T, HV, 128, device="cuda")
    state_eager, out_eager = t["state"].clone(), torch.empty_like(out)
    sums = compiled(decode)(state, out)
    gdnjit.gated_delta_rule_decode(t["q"], t["k"], t["v"], state_eager, **gates(t), output=out_eager, scale=0.25)
    torch.cuda.synchronize()
    assert torch.equal(out, out_eager) and torch.equal(state, state_eager)
    assert torch.allclose(sums, out_eager.sum(dim=-1), rtol=1e-4, atol=1e-4)
    ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], t["state"].double(),
                        layout="kmajor", scale=0.25)
    assert rel(out, ref.output) < 1e-3 and rel(state, ref.state) < 1e-3


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_compile_nvfp4_quantize(layout):
    x = torch.randn(200, 256, device="cuda", dtype=torch.bfloat16) * 4

    def quant(x, gs):
        fp4, sf = ops.nvfp4_quantize(x * 2, gs, layout)
        return fp4, sf

    gs = torch.tensor([448.0 * 6 / 32.0], device="cuda")
    fp4, sf = compiled(quant)(x, gs)
    efp4, esf = gdnjit.nvfp4_quantize(x * 2, gs, layout)
    rfp4, rsf = quantize_reference(x * 2, gs, layout)
    torch.cuda.synchronize()
    assert torch.equal(fp4, efp4) and torch.equal(sf, esf)
    assert torch.equal(fp4, rfp4) and torch.equal(sf, rsf)


# ---- a CUDA graph of a whole decode step -------------------------------------------------------------

class DecodeStep:
    """One linear-attention layer's decode step: fused projection -> q/k/v/a/b slices -> GDN over a slot
    pool -> RMS norm -> output projection -> NVFP4 quantize of the result."""

    H, HV, K, V, D = 2, 4, 128, 128, 256

    def __init__(self, api, device="cuda"):
        g = torch.Generator(device=device).manual_seed(7)
        H, HV, K, V, D = self.H, self.HV, self.K, self.V, self.D
        self.api = api
        self.n_proj = 2 * H * K + HV * V + 2 * HV  # 1032 columns: bf16 rows stay 16-byte aligned
        self.w_in = (torch.randn(self.n_proj, D, generator=g, device=device) / D ** 0.5).to(torch.bfloat16)
        self.w_out = (torch.randn(D, HV * V, generator=g, device=device) / (HV * V) ** 0.5).to(torch.bfloat16)
        self.A_log = torch.log(torch.rand(HV, generator=g, device=device) * 15 + 1)
        self.dt_bias = torch.randn(HV, generator=g, device=device)
        self.gs = torch.tensor([448.0 * 6 / 8.0], device=device)

    def __call__(self, hidden, pool, slots):
        B = hidden.shape[0]
        H, HV, K, V = self.H, self.HV, self.K, self.V
        proj = torch.nn.functional.linear(hidden, self.w_in)
        q = proj[:, :H * K].view(B, 1, H, K)
        k = proj[:, H * K:2 * H * K].view(B, 1, H, K)
        v = proj[:, 2 * H * K:2 * H * K + HV * V].view(B, 1, HV, V)
        a = proj[:, -2 * HV:-HV].view(B, 1, HV)
        b = proj[:, -HV:].view(B, 1, HV)
        fn = gdnjit.gated_delta_rule_decode_pretranspose if self.api == "eager" else \
            ops.gated_delta_rule_decode_pretranspose
        o, _ = fn(q, k, v, None, self.A_log, a, self.dt_bias, b, initial_state=pool, initial_state_indices=slots)
        o = torch.nn.functional.rms_norm(o.float(), (V,)).to(torch.bfloat16)
        y = torch.nn.functional.linear(o.view(B, HV * V), self.w_out)
        qfn = gdnjit.nvfp4_quantize if self.api == "eager" else ops.nvfp4_quantize
        fp4, sf = qfn(y, self.gs)
        return y, fp4, sf


@pytest.mark.parametrize("api", ["eager", "torch_ops"])
def test_cuda_graph_of_a_decode_step_replays_with_new_inputs(api):
    B, n_slots = 8, 20
    step = DecodeStep(api)
    g = torch.Generator(device="cuda").manual_seed(11)
    hidden = torch.randn(B, step.D, generator=g, device="cuda").to(torch.bfloat16)   # static input buffers
    slots = torch.arange(B, device="cuda", dtype=torch.int32)
    pool = torch.randn(n_slots, step.HV, step.V, step.K, generator=g, device="cuda") * 0.5

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, load, cuBLAS workspaces) outside the capture
        for _ in range(2):
            step(hidden, pool.clone(), slots)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(hidden, pool, slots)

    for it in range(4):
        hidden.copy_(torch.randn(B, step.D, generator=g, device="cuda").to(torch.bfloat16))
        perm = torch.randperm(n_slots, generator=g, device="cuda")[:B].to(torch.int32)
        perm[it % B] = -1  # a padding row
        slots.copy_(perm)
        pool_eager = pool.clone()
        expect = step(hidden.clone(), pool_eager, slots.clone())
        for o in outs:
            o.fill_(0xFF if o.dtype == torch.uint8 else float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        # The gdnjit kernels are deterministic; cuBLAS may pick another algorithm inside the capture, so the
        # projections (and what follows them) are compared to rounding, and bit for bit when they agree.
        assert rel(pool, pool_eager) < 1e-5, it
        assert not torch.isnan(outs[0]).any() and rel(outs[0], expect[0]) < 1e-2, it
        rfp4, rsf = quantize_reference(outs[0], step.gs)
        assert torch.equal(outs[1], rfp4) and torch.equal(outs[2], rsf), it
        if torch.equal(outs[0], expect[0]):
            assert all(torch.equal(x, y) for x, y in zip(outs, expect)), it


# ---- several GPUs: the op runs on the tensors' device, whatever the current device -----------------------

@pytest.mark.parametrize("api", ["eager", "torch_ops"])
def test_every_device_while_another_is_current(api):
    n = torch.cuda.device_count()
    mod = gdnjit if api == "eager" else ops
    for d in range(n):
        other = (d + 1) % n  # with one GPU: cuda:0 with the current device set explicitly
        dev = torch.device("cuda", d)
        t = inputs(5, 2, 2, 4, n_slots=9, device=dev, seed=d)
        idx = torch.tensor([8, 0, -1, 3, 5], device=dev, dtype=torch.int32)
        buf = torch.full((5, 2, 4, 128, 128), float("nan"), device=dev)
        pool = t["state"].clone()
        with torch.cuda.device(other):
            out, ret = mod.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, idx, **gates(t),
                                                intermediate_states_buffer=buf, disable_state_update=False)
            out1, _ = mod.gated_delta_rule_decode_pretranspose(t["q"][:, :1], t["k"][:, :1], t["v"][:, :1], None,
                                                               t["A_log"], t["a"][:, :1], t["dt_bias"],
                                                               t["b"][:, :1], initial_state=t["state"].clone(),
                                                               initial_state_indices=idx)
            assert torch.cuda.current_device() == other
        torch.cuda.synchronize(dev)
        assert out.device == dev and ret is pool
        ref = gdn_reference(t["q"], t["k"], t["v"], t["A_log"], t["a"], t["dt_bias"], t["b"], t["state"].double(),
                            read_indices=idx, intermediate=buf.double())
        assert rel(out, ref.output.to(torch.bfloat16)) < 1e-3, d
        assert rel(pool, ref.state) < 1e-3, d
        assert torch.equal(pool[[1, 2, 4, 6, 7]], t["state"][[1, 2, 4, 6, 7]]), d  # untouched slots
        live = [0, 1, 3, 4]
        assert rel(buf[live], ref.intermediate[live]) < 1e-3, d
        ref1 = gdn_reference(t["q"][:, :1], t["k"][:, :1], t["v"][:, :1], t["A_log"], t["a"][:, :1], t["dt_bias"],
                             t["b"][:, :1], t["state"].double(), read_indices=idx)
        assert rel(out1, ref1.output.to(torch.bfloat16)) < 1e-3, d

        kst = inputs(3, 1, 2, 4, layout="kmajor", device=dev, seed=10 + d)
        s = kst["state"].clone()
        with torch.cuda.device(other):
            outk, _ = mod.gated_delta_rule_decode(kst["q"], kst["k"], kst["v"], s, **gates(kst))
        torch.cuda.synchronize(dev)
        refk = gdn_reference(kst["q"], kst["k"], kst["v"], kst["A_log"], kst["a"], kst["dt_bias"], kst["b"],
                             kst["state"].double(), layout="kmajor")
        assert rel(outk, refk.output.to(torch.bfloat16)) < 1e-3 and rel(s, refk.state) < 1e-3, d

        x = torch.randn(130, 256, device=dev, dtype=torch.float16)
        gs = torch.tensor([448.0 * 6 / 5.0], device=dev)
        with torch.cuda.device(other):
            fp4, sf = mod.nvfp4_quantize(x, gs)
        rfp4, rsf = quantize_reference(x, gs)
        torch.cuda.synchronize(dev)
        assert fp4.device == dev and torch.equal(fp4, rfp4) and torch.equal(sf, rsf), d
