"""gdnjit.compat on CPU tensors (the torch reference behind the custom op): the engines' argument mapping, and
the one-line errors for what is not provided."""

from __future__ import annotations

import pytest
import torch

from gdnjit.compat import sglang, vllm
from gdnjit.reference.gdn import gdn_reference

H, HV, K, V = 2, 4, 64, 64


def _inp(total, seed=0):
    g = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (r(1, total, H, K).to(bf), r(1, total, H, K).to(bf), r(1, total, HV, V).to(bf), r(total, HV).to(bf),
            r(total, HV).to(bf), r(HV), r(HV), r(12, HV, V, K))


def _one(q, k, v, a, b, A, d, S, tok):
    r = gdn_reference(q[:, tok:tok + 1], k[:, tok:tok + 1], v[:, tok:tok + 1], A, a[None, tok:tok + 1], d,
                      b[None, tok:tok + 1], S[None].double())
    return r.output[0, 0], r.state[0]


def test_vllm_spec_mapping():
    q, k, v, a, b, A, d, pool = _inp(5)
    p0 = pool.clone()
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    idx = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 9]], dtype=torch.int32)
    acc = torch.tensor([3, 1, 1], dtype=torch.int32)
    o, st = vllm.fused_sigmoid_gating_delta_rule_update(A, a, b, d, q, k, v, initial_state=pool, cu_seqlens=cu,
                                                        ssm_state_indices=idx, num_accepted_tokens=acc,
                                                        use_qk_l2norm_in_kernel=True)
    assert st is pool and o.shape == (1, 5, HV, V)
    S = p0[3]  # request 0 starts from column 2
    for t in range(3):
        ot, S = _one(q, k, v, a, b, A, d, S, t)
        assert torch.allclose(o[0, t].double(), ot, atol=2e-2, rtol=2e-2)
        assert torch.allclose(pool[t + 1].double(), S, atol=1e-4, rtol=1e-4)
    S = p0[7]  # request 2: column 0 (slot 7); its second write goes to slot 0 (the null block): dropped
    for t in range(2):
        ot, S = _one(q, k, v, a, b, A, d, S, 3 + t)
        assert torch.allclose(o[0, 3 + t].double(), ot, atol=2e-2, rtol=2e-2)
    assert torch.allclose(pool[7].double(), _one(q, k, v, a, b, A, d, p0[7], 3)[1], atol=1e-4, rtol=1e-4)
    for s in (0, 4, 5, 6, 8, 9, 10, 11):
        assert torch.equal(pool[s], p0[s])


def test_vllm_packed_decode():
    """vLLM's default decode: q / k / v read from packed [q | k | v] rows of a wider buffer (row stride honoured),
    out written (zeros for slot <= 0, the null block), the pool updated in place at each live slot only."""
    B = 5
    q, k, v, a, b, A, d, pool = _inp(B, seed=7)
    buf = torch.zeros(B, 2 * H * K + HV * V + 24, dtype=torch.bfloat16)
    mixed = buf[:, :2 * H * K + HV * V]
    mixed.copy_(torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], 1))
    idx = torch.tensor([3, 0, 7, 1, -1], dtype=torch.int32)
    out = torch.full((B, 1, HV, V), 7.0, dtype=torch.bfloat16)
    p0 = pool.clone()
    o, st = vllm.fused_recurrent_gated_delta_rule_packed_decode(mixed, a, b, A, d, K ** -0.5, pool, out, idx,
                                                                use_qk_l2norm_in_kernel=True)
    assert o is out and st is pool
    for n, s in enumerate(idx.tolist()):
        if s <= 0:
            assert (out[n] == 0).all()
            continue
        ot, S = _one(q, k, v, a, b, A, d, p0[s], n)
        assert torch.allclose(out[n, 0].double(), ot, atol=2e-2, rtol=2e-2)
        assert torch.allclose(pool[s].double(), S, atol=1e-4, rtol=1e-4)
    for s in (0, 2, 4, 5, 6, 8, 9, 10, 11):
        assert torch.equal(pool[s], p0[s])


def test_sglang_packed_decode_rounds_beta_and_pads_negative_slots():
    """SGLang's packed decode: vLLM's signature, but slot 0 is live and a slot < 0 is padding (zeros out, no
    write), and beta = sigmoid(b) rounded to b's dtype before use (its kernel's cast): the state matches an oracle
    with the rounded beta and not one without it."""
    B = 4
    q, k, v, a, b, A, d, pool = _inp(B, seed=9)
    mixed = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], 1)
    idx = torch.tensor([0, -1, 6, 2], dtype=torch.int32)
    out = torch.full((B, 1, HV, V), 7.0, dtype=torch.bfloat16)
    p0 = pool.clone()
    sglang.fused_recurrent_gated_delta_rule_packed_decode(mixed, a, b, A, d, K ** -0.5, pool, out, idx,
                                                          use_qk_l2norm_in_kernel=True)
    b_rounded = torch.logit(torch.sigmoid(b.float()).to(torch.bfloat16).double())  # sigmoid() of it: the rounded beta
    assert (out[1] == 0).all()
    for n, s in ((0, 0), (2, 6), (3, 2)):
        ot, S = _one(q, k, v, a, b_rounded, A, d, p0[s], n)
        _, S_plain = _one(q, k, v, a, b, A, d, p0[s], n)
        assert torch.allclose(out[n, 0].double(), ot, atol=2e-2, rtol=2e-2)
        assert torch.allclose(pool[s].double(), S, atol=2e-5, rtol=1e-4)
        assert (pool[s].double() - S_plain).abs().max() > 1e-4  # the rounding is visible in the state
    for s in (1, 3, 4, 5, 7, 8, 9, 10, 11):
        assert torch.equal(pool[s], p0[s])


@pytest.mark.parametrize("kw,msg", [
    (dict(mixed_qkv=torch.zeros(5, 1, 2 * H * K + HV * V)), "mixed_qkv: expected a 2-D tensor"),
    (dict(mixed_qkv=torch.zeros(2 * H * K + HV * V, 5).t()), "mixed_qkv: the last dim must be contiguous"),
    (dict(mixed_qkv=torch.zeros(5, 2 * H * K + HV * V + 3)), "mixed_qkv: width"),
    (dict(mixed_qkv=torch.zeros(5, 6 * K + HV * V)), "mixed_qkv: the inferred q/k heads H=3 must divide HV=4"),
    (dict(a=torch.zeros(5, HV + 1)), "a: expected shape [B=5, HV=4]"),
    (dict(ssm_state_indices=torch.zeros(5, 2, dtype=torch.int32)), "ssm_state_indices: expected a 1-D tensor"),
    (dict(out=torch.zeros(5, HV, V)), "out: expected a contiguous tensor of shape [5, 1, 4, 64]"),
    (dict(out=torch.zeros(5, 1, V, HV).transpose(2, 3)), "(strided)"),
    (dict(initial_state=torch.zeros(12, HV, V)), "initial_state: expected a 4-D tensor"),
])
def test_vllm_packed_decode_errors(kw, msg):
    B = 5
    args = dict(mixed_qkv=torch.zeros(B, 2 * H * K + HV * V, dtype=torch.bfloat16), a=torch.zeros(B, HV),
                b=torch.zeros(B, HV), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV), scale=0.1,
                initial_state=torch.zeros(12, HV, V, K), out=torch.zeros(B, 1, HV, V),
                ssm_state_indices=torch.zeros(B, dtype=torch.int32))
    args.update(kw)
    with pytest.raises(ValueError) as e:
        vllm.fused_recurrent_gated_delta_rule_packed_decode(**args)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_vllm_not_inplace():
    q, k, v, a, b, A, d, pool = _inp(4)
    p0 = pool.clone()
    o, fin = vllm.fused_sigmoid_gating_delta_rule_update(
        A, a, b, d, q, k, v, initial_state=pool, inplace_final_state=False,
        cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32),
        ssm_state_indices=torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), use_qk_l2norm_in_kernel=True)
    assert torch.equal(pool, p0) and fin.shape == (4, HV, V, K)
    _, s0 = _one(q, k, v, a, b, A, d, p0[1], 0)
    assert torch.allclose(fin[0].double(), s0, atol=1e-4, rtol=1e-4)
    _, s2 = _one(q, k, v, a, b, A, d, p0[3], 2)
    assert torch.allclose(fin[2].double(), s2, atol=1e-4, rtol=1e-4)


def test_sglang_padding_from_zero_state_and_buffer_rows():
    q, k, v, a, b, A, d, pool = _inp(4)
    p0 = pool.clone()
    buf = torch.full((3, 2, HV, V, K), 7.0)
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        A, a, d, 1.0, 20.0, q, k, v, b, pool, torch.tensor([-1, 5], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32), disable_state_update=True,
        intermediate_states_buffer=buf, intermediate_state_indices=torch.tensor([2, -1], dtype=torch.int32))
    assert torch.equal(pool, p0)
    o0, s0 = _one(q, k, v, a, b, A, d, torch.zeros(HV, V, K), 0)  # padding: from zeros, outputs written
    assert torch.allclose(o[0, 0].double(), o0, atol=2e-2, rtol=2e-2)
    assert torch.allclose(buf[2, 0].double(), s0, atol=1e-4, rtol=1e-4)
    assert torch.equal(buf[:2], torch.full_like(buf[:2], 7.0))  # request 1 has row -1: nothing cached


def _rings(slots, L):
    """SGLang's per-layer ReplaySSM rings (rawv, rawk, g, beta) of L tokens, filled with 7."""
    return (torch.full((slots, HV, L, V), 7.0, dtype=torch.bfloat16), torch.full((slots, H, L, K), 7.0, dtype=torch.bfloat16),
            torch.full((slots, HV, L), 7.0), torch.full((slots, HV, L), 7.0))


@pytest.mark.parametrize("update", [False, True])
def test_sglang_cache_ring_stores_each_tokens_raw_inputs(update):
    """cache_ring: token t of a request stores its raw v, k (before the l2norm), log decay and beta at position t of
    its slot's rings (rings longer than the draft: the rest untouched); an empty request and a padding row store
    nothing; outputs and pool as without the rings."""
    lens, slots = [3, 0, 2, 3], [5, 2, -1, 7]
    cu = torch.tensor([0, 3, 3, 5, 8], dtype=torch.int32)
    q, k, v, a, b, A, d, pool = _inp(8, seed=3)
    idx = torch.tensor(slots, dtype=torch.int32)
    rings = _rings(12, 5)
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, disable_state_update=not update, cache_steps=3)
    p_ref = pool.clone()
    o_ref = sglang.fused_sigmoid_gating_delta_rule_update(A, a, d, 1.0, 20.0, q, k, v, b, p_ref, idx, **kw)
    o = sglang.fused_sigmoid_gating_delta_rule_update(A, a, d, 1.0, 20.0, q, k, v, b, pool, idx, cache_ring=True,
                                                      replayssm_rawv=rings[0], replayssm_rawk=rings[1],
                                                      replayssm_g=rings[2], replayssm_beta=rings[3], **kw)
    assert torch.equal(o, o_ref) and torch.equal(pool, p_ref)
    g_all = -torch.exp(A) * torch.nn.functional.softplus(a.float() + d)  # [total, HV] log decays
    written = torch.zeros(12, 5, dtype=torch.bool)
    for n, (s, length) in enumerate(zip(slots, lens)):
        for t in range(length if s >= 0 else 0):
            tok = int(cu[n]) + t
            written[s, t] = True
            assert torch.equal(rings[0][s, :, t], v[0, tok]) and torch.equal(rings[1][s, :, t], k[0, tok])
            assert torch.allclose(rings[2][s, :, t], g_all[tok], rtol=1e-5, atol=1e-6)
            assert torch.allclose(rings[3][s, :, t], torch.sigmoid(b[tok].float()), rtol=1e-6, atol=1e-7)
    for x in rings:
        assert (x.movedim(2, 1)[~written] == 7.0).all()  # [slots, L, ..] positions nobody wrote


@pytest.mark.parametrize("call,exc,msg", [
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(*x, is_kda=True), NotImplementedError, "is_kda"),
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(*x), ValueError, "initial_state: required"),
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(*x, initial_state=torch.zeros(4, HV, V, K)),
     NotImplementedError, "ssm_state_indices: required"),
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(
        *x, initial_state=torch.zeros(4, HV, V, K), ssm_state_indices=torch.zeros(4, dtype=torch.int32),
        num_accepted_tokens=torch.ones(4, dtype=torch.int32)), ValueError, "num_accepted_tokens: needs a 2-D"),
    (lambda x: vllm.fused_recurrent_gated_delta_rule(x[4], x[5], x[6], x[1], beta=torch.ones(1, 4, HV, V)),
     NotImplementedError, "beta: head-wise beta"),
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(*x, initial_state=[1], inplace_final_state=False,
                                                           ssm_state_indices=torch.zeros(4, dtype=torch.int32)),
     TypeError, "^initial_state: expected a torch.Tensor"),
    (lambda x: vllm.fused_sigmoid_gating_delta_rule_update(*x, initial_state=torch.zeros(4, HV, V, K),
                                                           ssm_state_indices=torch.zeros(4, dtype=torch.int32),
                                                           cu_seqlens=torch.tensor(4, dtype=torch.int32)),
     ValueError, "^cu_seqlens: expected 1 dimensions"),
])
def test_vllm_errors(call, exc, msg):
    q, k, v, a, b, A, d, _ = _inp(4)
    with pytest.raises(exc, match=msg):
        call((A, a, b, d, q, k, v))


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(is_kda=True), NotImplementedError, "is_kda"),
    (dict(lower_bound=-5.0), NotImplementedError, "lower_bound"),
    (dict(cache_ring=True), ValueError, "cache_ring: needs replayssm_rawv"),
    (dict(cache_ring=1), TypeError, "cache_ring: expected a bool"),
    (dict(replayssm_rawv=torch.zeros(12, HV, 1, V)), ValueError, "replayssm_\\*: given without cache_ring"),
    (dict(cache_ring=True, **dict(zip(("replayssm_rawv", "replayssm_rawk", "replayssm_g", "replayssm_beta"),
                                      _rings(12, 0)))), ValueError, "replayssm_rawv: expected >= T=1 tokens"),
    (dict(cache_ring=True, retrieve_parent_token=torch.zeros(4, 1, dtype=torch.int32),
          **dict(zip(("replayssm_rawv", "replayssm_rawk", "replayssm_g", "replayssm_beta"), _rings(12, 2)))),
     ValueError, "retrieve_parent_token: not with cache_ring"),
    (dict(match_cutedsl_decode=True), NotImplementedError, "match_cutedsl_decode"),
    (dict(retrieve_parent_token=torch.zeros(4, 1, dtype=torch.int32)), ValueError, "retrieve_parent_token: tree"),
    (dict(intermediate_state_indices=torch.zeros(4, dtype=torch.int32)), ValueError,
     "intermediate_state_indices: needs"),
    (dict(cu_seqlens=torch.tensor(4, dtype=torch.int32)), ValueError, "^cu_seqlens: expected 1 dimensions"),
    (dict(initial_state_source=(1, 2)), TypeError, "^initial_state_source: expected a torch.Tensor"),
])
def test_sglang_errors(kw, exc, msg):
    q, k, v, a, b, A, d, pool = _inp(4)
    kw = dict(dict(initial_state_source=pool, cu_seqlens=torch.arange(5, dtype=torch.int32)), **kw)
    with pytest.raises(exc, match=msg):
        sglang.fused_sigmoid_gating_delta_rule_update(A, a, d, 1.0, 20.0, q, k, v, b,
                                                      initial_state_indices=torch.zeros(4, dtype=torch.int32), **kw)


@pytest.mark.full  # 15 s of dynamo tracing (test_torch_ops traces the ops themselves in the default tier)
def test_compat_calls_trace_under_torch_compile():
    """Both engines' calls under torch.compile(fullgraph=True) (the engine_step custom op; CPU: its reference) give the
    eager call's outputs, pool and ReplaySSM rings."""
    import gdnjit.torch_ops  # noqa: F401  (registers the ops)

    q, k, v, a, b, A, d, pool = _inp(8, seed=3)
    idx = torch.tensor([5, 2, -1, 7], dtype=torch.int32)
    cu = torch.tensor([0, 3, 3, 5, 8], dtype=torch.int32)

    def sg(pool, r0, r1, r2, r3):
        return sglang.fused_sigmoid_gating_delta_rule_update(
            A, a, d, 1.0, 20.0, q, k, v, b, pool, idx, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
            disable_state_update=False, cache_steps=3, cache_ring=True, replayssm_rawv=r0, replayssm_rawk=r1,
            replayssm_g=r2, replayssm_beta=r3)

    def vl(pool):
        return vllm.fused_sigmoid_gating_delta_rule_update(
            A, a[:5], b[:5], d, q[:, :5], k[:, :5], v[:, :5], initial_state=pool,
            cu_seqlens=torch.tensor([0, 3, 3, 5], dtype=torch.int32),
            ssm_state_indices=torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 9]], dtype=torch.int32),
            num_accepted_tokens=torch.tensor([3, 1, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True)[0]

    for fn, extra in ((sg, 4), (vl, 0)):
        torch._dynamo.reset()
        eager = [pool.clone(), *(_rings(12, 5)[:extra])]
        traced = [pool.clone(), *(_rings(12, 5)[:extra])]
        want = fn(*eager)
        got = torch.compile(fn, fullgraph=True)(*traced)
        assert torch.equal(got, want) and all(torch.equal(x, y) for x, y in zip(traced, eager))
