"""gdnjit.spec_step (the fused speculative step) on CPU tensors: the cache allocator, one-line errors, the named calls,
the reference's algebra (a step = the ReplaySSM commit of the accepted tokens, then a verify from the new checkpoint;
a flush then a step with nothing accepted = the same step), the torch op's CPU path, and every new variant compiles
for sm_90 and sm_100a with no spills, no stack frame and no warnings."""

from __future__ import annotations

import pytest
import torch

import gdnjit
from gdnjit import dispatch
from gdnjit.reference.gdn import gdn_reference
from gdnjit.reference.replay import replay_commit_reference
from gdnjit.reference.spec_step import spec_step_reference
from gdnjit.spec import get_spec
from gdnjit.spec_step import prepare, spec_cache
from gdnjit.variant import Variant

S, H, HV, T, K, V, B = 10, 2, 4, 3, 64, 64, 4
bf = torch.bfloat16


def _args(**kw):
    d = dict(q=torch.zeros(B, T, H, K, dtype=bf), k=torch.zeros(B, T, H, K, dtype=bf),
             v=torch.zeros(B, T, HV, V, dtype=bf), A_log=torch.zeros(HV), a=torch.zeros(B, T, HV, dtype=bf),
             dt_bias=torch.zeros(HV), b=torch.zeros(B, T, HV, dtype=bf), state=torch.zeros(S, HV, V, K),
             state_indices=torch.zeros(B, dtype=torch.int32), num_accepted=torch.zeros(B, dtype=torch.int32),
             cache=spec_cache(S, H, HV, T, K, V), scale=None, use_qk_l2norm=True, softplus_beta=1.0,
             softplus_threshold=20.0, null_block_id=-1, output=None)
    d.update(kw)
    return d


def prep(flush=False, **kw):
    return prepare(*_args(**kw).values(), flush=flush, require_cuda=False)


def test_spec_cache_layout():
    c = spec_cache(S, H, HV, T, K, V, dtype=torch.float16, layers=3)
    assert c.k.shape == (3, S, 2, H, T, K) and c.v.shape == (3, S, 2, HV, T, V) and c.k.dtype == torch.float16
    assert c.g.shape == c.beta.shape == (3, S, 2, HV, T) and c.g.dtype == torch.float32
    assert c.ctl.shape == (3, S, 2) and c.ctl.dtype == torch.int32 and int(c.ctl.abs().sum()) == 0
    one = c.layer(1)
    assert one.k.shape == (S, 2, H, T, K) and one.k.data_ptr() == c.k[1].data_ptr()
    with pytest.raises(ValueError, match="layer: this cache has no layer dim"):
        one.layer(0)
    for kw, msg in ((dict(T=17), "T: expected 1..16"), (dict(HV=3), "HV: expected a multiple of H=2"),
                    (dict(slots=0), "slots: expected a positive int")):
        a = dict(slots=S, H=H, HV=HV, T=T, K=K, V=V)
        a.update(kw)
        with pytest.raises(ValueError, match=msg):
            spec_cache(**a)


def test_step_and_flush_calls():
    out, call = prep(state_indices=torch.zeros(B, dtype=torch.int64), null_block_id=0)
    p, a = call.params, call.args
    assert out.shape == (B, T, HV, V) and out.dtype == bf
    assert (p["fused_step"], p["update"], p["null_slot"], p["idx_dtype"], p["T"]) == ("step", False, "negative",
                                                                                      "int64", T)
    # null_block_id: any int >= -1, a kernel argument (the first live slot), one variant for all
    assert a["min_slot"] == 1 and prep(null_block_id=4)[1].args["min_slot"] == 5
    assert prep(null_block_id=4)[1].params == prep(null_block_id=-1)[1].params
    assert a["ctl"] != 0 and a["acc"] != 0 and a["rk"] != 0 and a["zero_padding"] == 1 and a["pool_size"] == S
    _, call = prep(output=torch.zeros(B, T, HV, V))
    assert call.args["zero_padding"] == 0  # a caller's output: padding rows left as they were
    out, call = prep(flush=True, q=None, k=None, v=None, A_log=None, a=None, dt_bias=None, b=None)
    assert out is None and call.params["fused_step"] == "flush" and call.args["q"] == 0 and call.params["T"] == T
    # T of a flush is the cache's
    out, call = prep(flush=True, q=None, cache=spec_cache(S, H, HV, 7, K, V))
    assert call.params["T"] == 7
    # a page-strided pool: the slot pitch is passed
    pages = torch.zeros(S, 2, HV, V, K)
    assert prep(state=pages[:, 1])[1].args["slot_stride"] == 2 * HV * V * K


def _bad_cache(i, x):
    c = list(spec_cache(S, H, HV, T, K, V))
    c[i] = x
    return gdnjit.SpecCache(*c)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(state=torch.zeros(S, HV, V, 96)), ValueError, "state: K and V (dims 3, 2) must be in"),
    (dict(state=torch.zeros(S, HV, V, K, dtype=torch.float16)), TypeError, "state: expected dtype float32, bfloat16"),
    (dict(state=torch.zeros(S, HV, K, V).transpose(2, 3)), ValueError, "state: each slot's [HV, V, K] block must be dense"),
    (dict(q=torch.zeros(B, T, H, K)), TypeError, "q: expected dtype bfloat16 or float16"),
    (dict(q=torch.zeros(B + 1, T, H, K, dtype=bf)), ValueError, "q: expected B=4 rows"),
    (dict(q=torch.zeros(B, 17, H, K, dtype=bf)), ValueError, "q: the draft tokens T (dim 1) must be in 1..16"),
    (dict(q=torch.zeros(B, T, 3, K, dtype=bf)), ValueError, "q: its heads H=3 (dim 2) must divide"),
    (dict(k=torch.zeros(B, T, H, K, dtype=torch.float16)), TypeError, "k: expected dtype bfloat16"),
    (dict(v=torch.zeros(B, T, HV, V + 64, dtype=bf)), ValueError, "v: expected shape"),
    (dict(a=torch.zeros(B, T, HV)), TypeError, "a: expected dtype bfloat16"),
    (dict(A_log=torch.zeros(HV + 1)), ValueError, "A_log: expected shape"),
    (dict(state_indices=torch.zeros(B, dtype=torch.int16)), TypeError, "state_indices: expected dtype"),
    (dict(num_accepted=torch.zeros(B, dtype=torch.int64)), TypeError, "num_accepted: expected dtype int32"),
    (dict(num_accepted=torch.zeros(B + 1, dtype=torch.int32)), ValueError, "num_accepted: expected shape"),
    (dict(num_accepted=torch.zeros(B, 2, dtype=torch.int32)[:, 0]), ValueError, "num_accepted: expected a contiguous"),
    (dict(cache=(1, 2)), TypeError, "cache: expected a SpecCache"),
    (dict(cache=spec_cache(S, H, HV, T + 1, K, V)), ValueError, "cache.k: expected T=3 tokens"),
    (dict(cache=spec_cache(S + 1, H, HV, T, K, V)), ValueError, "cache.k: expected shape [slots, 2, H, T, K]"),
    (dict(cache=spec_cache(S, H, HV, T, K, V, dtype=torch.float16)), TypeError, "cache.k: expected dtype bfloat16"),
    (dict(cache=_bad_cache(2, torch.zeros(S, 2, HV, T, dtype=bf))), TypeError, "cache.g: expected dtype float32"),
    (dict(cache=_bad_cache(4, torch.zeros(S, 2, dtype=torch.int64))), TypeError, "cache.ctl: expected dtype int32"),
    (dict(cache=_bad_cache(3, torch.zeros(S, HV, 2, T).transpose(1, 2))), ValueError, "cache.beta: expected a contiguous"),
    (dict(scale=0.0), ValueError, "scale: expected a positive float"),
    (dict(softplus_beta=True), TypeError, "softplus_beta: expected a Python float"),
    (dict(use_qk_l2norm=1), TypeError, "use_qk_l2norm: expected a bool"),
    (dict(null_block_id=-2), ValueError, "null_block_id: expected an int >= -1"),
    (dict(null_block_id=0.0), TypeError, "null_block_id: expected an int >= -1, got float"),
    (dict(output=torch.zeros(B, T, HV, V, dtype=torch.int32)), TypeError, "output: expected dtype"),
    (dict(output=torch.zeros(B, T + 1, HV, V)), ValueError, "output: expected shape"),
])
def test_errors(kw, exc, msg):
    with pytest.raises(exc) as e:
        prep(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_flush_errors():
    with pytest.raises(ValueError, match=r"cache.k: its heads H \(dim 2\) must divide HV=4"):
        prep(flush=True, cache=spec_cache(S, 3, 3, T, K, V))
    # the cache's key tensor missing or of other dims: named before its heads are read (was AttributeError)
    c = spec_cache(S, H, HV, T, K, V)
    with pytest.raises(TypeError, match=r"^cache.k: expected a torch.Tensor"):
        prep(flush=True, cache=c._replace(k=None))
    with pytest.raises(ValueError, match=r"^cache.k: expected 5 dimensions"):
        prep(flush=True, cache=c._replace(k=c.k[0]))
    with pytest.raises(TypeError, match=r"^cache: expected a SpecCache"):
        prep(flush=True, cache=(1, 2))


def test_cuda_required():
    with pytest.raises(ValueError, match="state: expected a CUDA tensor"):
        gdnjit.gated_delta_rule_spec_step(*list(_args().values())[:11])


def _random(seed, sdt=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k, v = r(B, T, H, K).to(bf), r(B, T, H, K).to(bf), r(B, T, HV, V).to(bf)
    a, b = r(B, T, HV).to(bf), r(B, T, HV).to(bf)
    A_log, dtb = torch.rand(HV, generator=g), r(HV)
    state = (r(S, HV, V, K) * 0.1).to(sdt)
    return q, k, v, A_log, a, dtb, b, state


def test_reference_step_is_commit_then_verify():
    """A step = FlashInfer's commit of the previous step's accepted tokens, then a verify from the new checkpoint."""
    q, k, v, A_log, a, dtb, b, state = _random(1)
    idx = torch.tensor([3, -1, 7, 0], dtype=torch.int32)
    cache = spec_cache(S, H, HV, T, K, V)
    first = spec_step_reference(q, k, v, A_log, a, dtb, b, state, idx, torch.zeros(B, dtype=torch.int32), cache)
    cache = gdnjit.SpecCache(*first.cache)
    assert first.cache[4][[3, 7, 0], 0].tolist() == [1, 1, 1] and first.cache[4][1, 0] == 0
    assert torch.equal(first.state, state)  # nothing accepted yet: no state write
    ref_v = gdn_reference(q, k, v, A_log, a, dtb, b, state, read_indices=idx, disable_state_update=True)
    assert torch.allclose(first.output, ref_v.output, atol=1e-12)
    acc = torch.tensor([2, 1, 3, 0], dtype=torch.int32)
    q2, k2, v2, _, a2, _, b2, _ = _random(2)
    second = spec_step_reference(q2, k2, v2, A_log, a2, dtb, b2, state, idx, acc, cache)
    # the commit of the cached half (ctl says 1) with FlashInfer's layout: [L=1, slots, heads, T, dim]
    c = [x[:, 1].unsqueeze(0) for x in cache[:4]]
    ckpt = replay_commit_reference(state.unsqueeze(0), c[1], c[0], c[2], c[3], idx, acc)[0]
    assert torch.allclose(second.state, ckpt, atol=1e-12)
    ref_v2 = gdn_reference(q2, k2, v2, A_log, a2, dtb, b2, ckpt, read_indices=idx, disable_state_update=True)
    assert torch.allclose(second.output, ref_v2.output, atol=1e-12)
    assert second.cache[4][[3, 7, 0], 0].tolist() == [0, 0, 0]
    # a flush, then a step with nothing accepted: the same step
    fl = spec_step_reference(None, None, None, None, None, None, None, state, idx, acc, cache, flush=True)
    assert torch.equal(fl.state, second.state) and torch.equal(fl.cache[4], cache.ctl)
    after = spec_step_reference(q2, k2, v2, A_log, a2, dtb, b2, fl.state, idx, torch.zeros(B, dtype=torch.int32),
                                gdnjit.SpecCache(*fl.cache))
    assert torch.allclose(after.output, second.output, atol=1e-12)


def test_torch_op_cpu_path_matches_the_reference():
    import gdnjit.torch_ops as ops

    q, k, v, A_log, a, dtb, b, state = _random(3, torch.float32)
    idx = torch.tensor([3, -1, 7, 0], dtype=torch.int32)
    cache = spec_cache(S, H, HV, T, K, V)
    out = ops.spec_step(q, k, v, A_log, a, dtb, b, state, idx, torch.zeros(B, dtype=torch.int32), cache)
    assert (out[1] == 0).all() and cache.ctl[3, 0] == 1
    acc = torch.tensor([3, 2, 1, 2], dtype=torch.int32)
    ref = spec_step_reference(q, k, v, A_log, a, dtb, b, state, idx, acc, cache, dtype=torch.float32)
    out = ops.spec_step(q, k, v, A_log, a, dtb, b, state, idx, acc, cache)
    assert torch.allclose(out.float(), ref.output, atol=1e-2) and torch.equal(state, ref.state)


@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_two_token_step_takes_the_tc_form_from_mid_batches(sdt):
    """T = 2, bf16 q/k, K = V = 128: the tc form from B * HV 1024 (fp32; bf16 from 256), the recurrent loop below
    (docs/perf.md v28: the fp32 tc step at T = 2 0.84-0.90 of the recurrent rule's time once its tiles moved whole
    sectors)."""
    spec = get_spec("gdn")
    call = prep(q=torch.zeros(B, 2, H, 128, dtype=bf), k=torch.zeros(B, 2, H, 128, dtype=bf),
                v=torch.zeros(B, 2, HV, 128, dtype=bf), a=torch.zeros(B, 2, HV, dtype=bf),
                b=torch.zeros(B, 2, HV, dtype=bf), state=torch.zeros(S, HV, 128, 128, dtype=sdt),
                cache=spec_cache(S, H, HV, 2, 128, 128))[1]
    form = {rows: dispatch.select(spec, call.params, dict(B=rows, H=16, HV=64, num_sms=132))[0]["form"]
            for rows in (1, 16, 64, 512)}  # B * HV 64, 1024, 4096, 32768
    assert form == {1: "recurrent", 16: "tc", 64: "tc", 512: "tc"}, form


@pytest.mark.sample(1)  # ~9 s a case
@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("sdt", [torch.float32, torch.bfloat16])
def test_variants_compile_without_spills(sdt, arch):
    spec = get_spec("gdn")
    seen = set()
    for KV in ((128, 128), (64, 64), (256, 128), (128, 256), (256, 256)):
        for t in (1, 2, 4, 8, 16):
            c = spec_cache(S, H, HV, t, KV[0], KV[1])
            st = torch.zeros(S, HV, KV[1], KV[0], dtype=sdt)
            calls = [prep(q=torch.zeros(B, t, H, KV[0], dtype=bf), k=torch.zeros(B, t, H, KV[0], dtype=bf),
                          v=torch.zeros(B, t, HV, KV[1], dtype=bf), a=torch.zeros(B, t, HV, dtype=bf),
                          b=torch.zeros(B, t, HV, dtype=bf), state=st, cache=c)[1],
                     prep(flush=True, state=st, cache=c)[1]]
            for call in calls:
                for rows in (1, 64, 512):
                    tun, _ = dispatch.select(spec, call.params, dict(B=rows, H=16, HV=64, num_sms=132))
                    key = (tuple(sorted(call.params.items())), tuple(sorted(tun.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    meta = Variant.make(spec, call.params, tun, arch).build().meta
                    assert meta["spill_bytes"] == 0 and meta["stack_bytes"] == 0 and not meta["warnings"], (
                        call.params, tun, meta)
