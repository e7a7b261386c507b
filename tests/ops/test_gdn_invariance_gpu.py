"""Bitwise invariance of the GDN ops on the GPU (issue 25; run on the device: pytest -m gpu).

For the same request data and shapes, outputs and states must be bit-identical whether the per-token states are
written through ``ssm_state_indices`` or a dense intermediate buffer (FlashInfer's scatter-vs-dense test), whether
q / k / v are slices of one packed projection or contiguous tensors, whatever the request's row in the batch, and,
in batch-invariant mode (GDNJIT_BATCH_INVARIANT=1), whatever else is batched with it. Also FlashInfer's padding
conventions: a caller's output rows of padding requests are left as they were at T > 1, zeroed at T = 1.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import gdnjit
from gdnjit import config as gconfig
from gdnjit.reference.gdn import gdn_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _inputs(B, T, H, HV, K, V, seed, packed=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    bf = torch.bfloat16
    if packed:  # q, k, v as views of one [B, T, 2 H K + HV V] projection (a fused qkv GEMM's output)
        proj = torch.randn(B, T, 2 * H * K + HV * V, device=DEV, dtype=bf, generator=g)
        q = proj[..., :H * K].unflatten(-1, (H, K))
        k = proj[..., H * K:2 * H * K].unflatten(-1, (H, K))
        v = proj[..., 2 * H * K:].unflatten(-1, (HV, V))
    else:
        q = torch.randn(B, T, H, K, device=DEV, dtype=bf, generator=g)
        k = torch.randn(B, T, H, K, device=DEV, dtype=bf, generator=g)
        v = torch.randn(B, T, HV, V, device=DEV, dtype=bf, generator=g)
    a = torch.randn(B, T, HV, device=DEV, dtype=bf, generator=g)
    b = torch.randn(B, T, HV, device=DEV, dtype=bf, generator=g)
    A_log = torch.rand(HV, device=DEV, generator=g)
    dt_bias = torch.randn(HV, device=DEV, generator=g)
    return q, k, v, A_log, a, dt_bias, b


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [2, 4, 8])
# B 64 / 128 hold up to ~40 GiB (three pools of B (T + 1) slots, the buffer, the float64 reference's copies)
@pytest.mark.parametrize("B", [1, 4, 16, pytest.param(64, marks=pytest.mark.big_memory),
                               pytest.param(128, marks=pytest.mark.big_memory)])
def test_scatter_and_dense_buffer_are_bit_identical(B, T, state_dtype):
    """FlashInfer's test_gdn_decode_fp32_state_fla_scatter_vs_dense (H = 16, HV = 64, K = V = 128, pool of
    B (T + 1) slots, ssm_state_indices = arange(B, B + B T)): every per-token state and output equal bit for bit,
    and the dense run's final writeback equals its last buffered state."""
    H, HV, K, V = 16, 64, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=B * 100 + T)
    pool0 = torch.randn(B * (T + 1), HV, V, K, device=DEV).to(state_dtype)
    idx = torch.arange(B, device=DEV, dtype=torch.int32)
    pool_d, pool_s = pool0.clone(), pool0.clone()
    buf = torch.full((B, T, HV, V, K), float("nan"), device=DEV, dtype=state_dtype)
    out_d, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool_d, idx, A_log, a, dt_bias, b, intermediate_states_buffer=buf,
                                           disable_state_update=False)
    ssm = torch.arange(B, B + B * T, device=DEV, dtype=torch.int32).reshape(B, T)
    out_s, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool_s, idx, A_log, a, dt_bias, b, ssm_state_indices=ssm,
                                           disable_state_update=False)
    torch.cuda.synchronize()
    assert torch.equal(out_d, out_s)
    assert torch.equal(pool_s[ssm.flatten().long()], buf.flatten(0, 1))
    assert torch.equal(pool_d[:B], buf[:, T - 1])  # the final writeback is the last stored state
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool0.double(), read_indices=idx,
                        intermediate=torch.zeros(B, T, HV, V, K, dtype=torch.float64, device=DEV))
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    assert (out_d.double() - ref.output).norm() / ref.output.norm() < tol
    assert (buf.double() - ref.intermediate).norm() / ref.intermediate.norm() < tol


@pytest.mark.parametrize("api", ["pretranspose", "mtp"])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_packed_qkv_and_batch_position_do_not_change_bits(api, T):
    """q / k / v as strided views of one projection vs contiguous copies, and the batch reversed: each
    request's output and state bits are the same."""
    if api == "pretranspose" and T > 1:
        pytest.skip("T > 1 is the mtp path")
    B, H, HV, K, V = 37, 4, 8, 128, 128
    qp, kp, vp, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=T, packed=True)
    runs = []
    for variant in ("packed", "contiguous", "reversed"):
        q, k, v, aa, bb = qp, kp, vp, a, b
        if variant != "packed":
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        perm = torch.arange(B, device=DEV)
        if variant == "reversed":
            perm = perm.flip(0)
            q, k, v, aa, bb = (x[perm].contiguous() for x in (q, k, v, aa, bb))
        pool = torch.randn(2 * B, HV, V, K, device=DEV, generator=torch.Generator(device=DEV).manual_seed(7))
        idx = (2 * torch.arange(B, device=DEV, dtype=torch.int32))[perm]
        if api == "mtp":
            out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, aa, dt_bias, bb, disable_state_update=0)
        else:
            out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, aa, dt_bias, bb,
                                                                 initial_state=pool, initial_state_indices=idx)
        inv = torch.argsort(perm)
        runs.append((out[inv], pool))
    torch.cuda.synchronize()
    for out, pool in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(pool, runs[0][1])


@pytest.fixture
def batch_invariant():
    old = gconfig.get_config()
    gconfig.set_config(dataclasses.replace(old, batch_invariant=True))
    yield
    gconfig.set_config(old)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [2, 4, 8])
@pytest.mark.parametrize("B", [1, 4, 64])
def test_scatter_into_a_split_pool_also_writes_the_final_state(B, T, state_dtype):
    """FlashInfer's split-pool scatter (test_gdn_decode_bf16_state_fla_scatter_vs_dense, split_pool=True):
    ssm_state_indices and output_state_indices together write every token's state to its slot and the final state
    to output_state_indices[n], bit-identical to the dense buffer's entries; the read slots keep their bits."""
    H, HV, K, V = 16, 64, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=B * 10 + T)
    pool0 = torch.randn(B * (T + 2), HV, V, K, device=DEV).to(state_dtype)
    read = torch.arange(B, device=DEV, dtype=torch.int32)
    ssm = torch.arange(B, B + B * T, device=DEV, dtype=torch.int32).reshape(B, T)
    out_idx = torch.arange(B * (T + 1), B * (T + 2), device=DEV, dtype=torch.int32)
    pool_s, pool_d = pool0.clone(), pool0.clone()
    o_s, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool_s, read, A_log, a, dt_bias, b, ssm_state_indices=ssm,
                                         output_state_indices=out_idx, disable_state_update=False)
    buf = torch.empty(B, T, HV, V, K, device=DEV, dtype=state_dtype)
    o_d, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool_d, read, A_log, a, dt_bias, b, intermediate_states_buffer=buf,
                                         disable_state_update=True)
    torch.cuda.synchronize()
    assert torch.equal(o_s, o_d)
    assert torch.equal(pool_s[ssm.long()], buf)
    assert torch.equal(pool_s[out_idx.long()], buf[:, T - 1])
    assert torch.equal(pool_s[:B], pool0[:B])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_batch_invariant_mode_gives_one_requests_bits_in_any_batch(batch_invariant, T, state_dtype):
    """GDNJIT_BATCH_INVARIANT=1: request 0 alone (B = 1) and inside batches of 3, 64 and 512 gives the same output
    and state bits (without the mode the dispatcher picks per-B variants whose arithmetic may differ)."""
    H, HV, K, V = 16, 32, 128, 128
    big = 512
    q, k, v, A_log, a, dt_bias, b = _inputs(big, T, H, HV, K, V, seed=T)
    pool0 = torch.randn(big, HV, V, K, device=DEV).to(state_dtype)
    results = []
    for B in (1, 3, 64, big):
        pool = pool0[:B].clone()
        idx = torch.arange(B, device=DEV, dtype=torch.int32)
        out, _ = gdnjit.gated_delta_rule_mtp(q[:B], k[:B], v[:B], pool, idx, A_log, a[:B], dt_bias, b[:B],
                                             disable_state_update=False)
        results.append((out[0].clone(), pool[0].clone()))
    torch.cuda.synchronize()
    for out, st in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(st, results[0][1])


@pytest.mark.parametrize("T", [1, 4])
def test_padding_rows_of_a_callers_output(T):
    """FlashInfer's conventions: at T > 1 (mtp) a caller's output rows of padding requests are left as they were;
    an output the op allocates has zeros there; a T = 1 decode writes zeros. Flags as ints (0 / 1) work."""
    B, H, HV, K, V = 6, 2, 4, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=3)
    pool = torch.randn(8, HV, V, K, device=DEV)
    idx = torch.tensor([3, -1, 0, 7, -1, 5], device=DEV, dtype=torch.int32)
    pad = idx < 0
    out = torch.full((B, T, HV, V), 7.0, device=DEV, dtype=torch.bfloat16)
    if T > 1:
        before = pool.clone()
        gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, output=out, disable_state_update=1)
        fresh, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, disable_state_update=1)
        torch.cuda.synchronize()
        assert torch.equal(pool, before)  # 1: frozen
        assert (out[pad] == 7.0).all() and (fresh[pad] == 0).all()
        assert torch.equal(out[~pad], fresh[~pad])
    else:
        gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b, output=out,
                                                    initial_state=pool, initial_state_indices=idx,
                                                    disable_state_update=0)
        torch.cuda.synchronize()
        assert (out[pad] == 0).all() and torch.isfinite(out[~pad].float()).all()


def test_pretranspose_at_t_above_1_is_the_mtp_step():
    """FlashInfer 0.7.2's decode_pretranspose takes intermediate_states_buffer / disable_state_update at T > 1:
    the same bits as gated_delta_rule_mtp."""
    B, T, H, HV, K, V = 5, 4, 2, 4, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=11)
    pool0 = torch.randn(6, HV, V, K, device=DEV)
    idx = torch.tensor([0, 2, -1, 4, 5], device=DEV, dtype=torch.int32)
    res = []
    for fn in ("pretranspose", "mtp"):
        pool = pool0.clone()
        buf = torch.full((B, T, HV, V, K), float("nan"), device=DEV)
        if fn == "mtp":
            out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b,
                                                 intermediate_states_buffer=buf, disable_state_update=True)
        else:
            out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b,
                                                                 initial_state=pool, initial_state_indices=idx,
                                                                 intermediate_states_buffer=buf,
                                                                 disable_state_update=True)
        res.append((out, pool, buf))
    torch.cuda.synchronize()
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], pool0) and torch.equal(res[1][1], pool0)
    live = idx >= 0
    assert torch.equal(res[0][2][live], res[1][2][live])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 4, 8])
@pytest.mark.parametrize("view", ["heads::2", "heads::3", "rows+8"])
@pytest.mark.parametrize("mode", ["update", "verify", "ssm"])
def test_pool_strided_inside_a_slot(view, T, state_dtype, mode):
    """A pool that is a strided view of a bigger one (FlashInfer's test_mtp_fp32_state_pool_non_contiguous:
    every m-th head; also padded value rows): outputs, written slots and the per-token states as with the same
    values in a contiguous pool, against the float64 reference; the interleaved memory is never touched."""
    if mode == "ssm" and T == 1:
        pytest.skip("per-token pool writes need T > 1 (as in FlashInfer)")
    B, H, HV, K, V = 6, 2, 4, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=T * 7 + len(view))
    slots = 2 * B + B * T
    if view.startswith("heads"):
        m = int(view[-1])
        backing = torch.randn(slots, HV * m, V, K, device=DEV).to(state_dtype)
        pool = backing[:, ::m]
    else:
        backing = torch.randn(slots, HV, V, K + 8, device=DEV).to(state_dtype)
        pool = backing[..., :K]
    assert not pool.is_contiguous()
    backing0, pool0 = backing.clone(), pool.clone()
    idx = torch.tensor([3, -1, 0, 7, 5, 10], device=DEV, dtype=torch.int32)
    kw, ref_kw = {}, {}
    if mode == "verify":
        buf = torch.full((B, T, HV, V, K), float("nan"), device=DEV, dtype=state_dtype)
        kw = dict(intermediate_states_buffer=buf, disable_state_update=True)
        ref_kw = dict(intermediate=torch.zeros(B, T, HV, V, K, device=DEV, dtype=torch.float64),
                      disable_state_update=True)
    elif mode == "ssm":
        ssm = (2 * B + torch.arange(B * T, device=DEV, dtype=torch.int32)).reshape(B, T)
        kw = dict(ssm_state_indices=ssm, disable_state_update=False)
        ref_kw = dict(ssm_state_indices=ssm)
    else:
        kw = dict(disable_state_update=False)
    if T == 1 and mode == "update":
        out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b, initial_state=pool,
                                                             initial_state_indices=idx)
    else:
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, **kw)
    torch.cuda.synchronize()
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool0.double(), read_indices=idx, **ref_kw)
    live = idx >= 0
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    o, r = out[live].double(), ref.output[live]
    assert (o - r).norm() / r.norm() < tol
    assert (pool.double() - ref.state).norm() / ref.state.norm() < tol
    if mode == "verify":
        assert torch.equal(pool, pool0)
        assert (buf[live].double() - ref.intermediate[live]).norm() / ref.intermediate[live].norm() < tol
    # memory of the backing tensor outside the view: untouched, bit for bit
    outside = torch.ones_like(backing, dtype=torch.bool)
    if view.startswith("heads"):
        outside[:, ::int(view[-1])] = False
    else:
        outside[..., :K] = False
    assert torch.equal(backing[outside], backing0[outside])


@pytest.mark.parametrize("layout", ["klast", "kmajor"])
@pytest.mark.parametrize("T", [1, 4])
def test_direct_state_strided_inside(layout, T):
    """A direct state that is a strided view (every other head; padded rows) runs in place, like a dense one."""
    B, H, HV, K, V = 5, 2, 4, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=T + (layout == "kmajor"))
    for view in ("heads", "rows"):
        backing = torch.randn(B, 2 * HV, V, K + 8, device=DEV)
        state = backing[:, ::2, :, :K] if view == "heads" else backing[:, :HV, :, :K]
        backing0, state0 = backing.clone(), state.clone()
        fn = gdnjit.gated_delta_rule_decode if layout == "kmajor" else gdnjit.gated_delta_rule_decode_pretranspose
        out, ret = fn(q, k, v, state, A_log, a, dt_bias, b)
        torch.cuda.synchronize()
        assert ret is state
        ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, state0.double(), layout=layout)
        assert (out.double() - ref.output).norm() / ref.output.norm() < 2e-3
        assert (state.double() - ref.state).norm() / ref.state.norm() < 2e-3
        outside = torch.ones_like(backing, dtype=torch.bool)
        if view == "heads":
            outside[:, ::2, :, :K] = False
        else:
            outside[:, :HV, :, :K] = False
        assert torch.equal(backing[outside], backing0[outside]), view


@pytest.mark.parametrize("form", ["tc", "mma", "chunk", "pipe"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [4, 8])
def test_strided_pool_in_every_form(form, state_dtype, T):
    """The strided-slot variants of each form (forced: the rules pick them only at larger batches) against the
    float64 reference, every-other-head pool; the other heads untouched."""
    from gdn_cases import forcing

    B, H, HV, K, V = 6, 2, 4, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=T)
    backing = torch.randn(B + 2, 2 * HV, V, K, device=DEV).to(state_dtype)
    pool = backing[:, ::2]
    backing0, pool0 = backing.clone(), pool.clone()
    idx = torch.tensor([3, -1, 0, 7, 5, 1], device=DEV, dtype=torch.int32)
    override = {"pipe": 2} if form == "pipe" else {"form": form}
    with forcing(override):
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, disable_state_update=False)
        torch.cuda.synchronize()
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool0.double(), read_indices=idx)
    live = idx >= 0
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    assert (out[live].double() - ref.output[live]).norm() / ref.output[live].norm() < tol
    assert (pool.double() - ref.state).norm() / ref.state.norm() < tol
    assert torch.equal(backing[:, 1::2], backing0[:, 1::2])


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("T", [2, 3, 4, 8])
@pytest.mark.parametrize("shape", [(37, 4, 16, 128, "pool"), (5, 2, 8, 256, "strided"), (9, 1, 3, 256, "pool")])
def test_tc_row_tile_does_not_change_bits(shape, T, cache):
    """The bf16 verify without a writeback in the tc form with 128-row tiles (two 64-row blocks per warp, one after
    the other; the rules' choice from B * HV 4096) gives the 64-row tiles' bits: outputs and ReplaySSM caches, with a
    padding row, GVA, V = 256 (two tiles per head) and a strided pool."""
    from gdn_cases import forcing

    B, H, HV, V, kind = shape
    if kind == "strided" and cache:
        pytest.skip("ReplaySSM's caching verify takes dense slots (an engine convention: docs/api.md)")
    if T == 2 and not cache:
        pytest.skip("the tc form takes T = 2 for ReplaySSM's verify only (the output-only verify: T 3..8)")
    K, bf, nan = 128, torch.bfloat16, float("nan")
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=10 * B + T)
    slots = 2 * B + 3
    if kind == "strided":  # every other head of a bigger pool
        pool = (torch.randn(slots, 2 * HV, V, K, device=DEV) * 0.1).to(bf)[:, ::2]
    else:
        pool = (torch.randn(slots, HV, V, K, device=DEV) * 0.1).to(bf)
    pool0 = pool.clone()
    idx = torch.randperm(slots, device=DEV)[:B].to(torch.int32)
    idx[1] = -1  # a padding row
    got = {}
    for tile in (64, 128):
        out = torch.full((B, T, HV, V), nan, device=DEV, dtype=bf)
        kw = {}
        if cache:
            kw = dict(cache_replayssm=True, replayssm_rawv=torch.full((slots, HV, T, V), nan, device=DEV, dtype=bf),
                      replayssm_rawk=torch.full((slots, H, T, K), nan, device=DEV, dtype=bf),
                      replayssm_g=torch.full((slots, HV, T), nan, device=DEV),
                      replayssm_beta=torch.full((slots, HV, T), nan, device=DEV))
        with forcing({"form": "tc", "tile_v": tile}):
            gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, output=out, disable_state_update=True,
                                        **kw)
            torch.cuda.synchronize()
        assert torch.equal(pool, pool0)
        got[tile] = [out.view(torch.int16)] + [x.view(torch.int16 if x.dtype == bf else torch.int32) for x in kw.values()
                                               if isinstance(x, torch.Tensor)]
    assert all(torch.equal(x, y) for x, y in zip(got[64], got[128]))
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool0.double(), read_indices=idx, disable_state_update=True)
    live = idx >= 0
    out = got[128][0].view(bf)
    assert (out[live].double() - ref.output[live]).norm() / ref.output[live].norm() < 2e-2



@pytest.mark.parametrize("T", [2, 3, 4, 8])
@pytest.mark.parametrize("mode", ["update", "commit", "spec_step"])
@pytest.mark.parametrize("shape", [(37, 4, 16, 128, "pool"), (5, 2, 8, 256, "pool"), (9, 1, 3, 256, "strided")])
def test_tc_row_tile_of_a_state_write_does_not_change_bits(shape, mode, T):
    """The bf16 state's writing tc kernels (the state-updating multi-token call, ReplaySSM's commit, the fused step:
    replay, checkpoint write and verify) with 128-row tiles (two 64-row blocks per warp, one after the other) give the
    64-row tiles' bits: outputs, state, caches and control words, over two steps, with a padding row, accept counts
    0..T, GVA, V = 256 (two tiles per head) and a strided pool where the call takes one."""
    from gdn_cases import forcing

    B, H, HV, V, kind = shape
    if kind == "strided" and mode != "update":
        pytest.skip("the commit's and the step's pools are dense per slot (docs/api.md)")
    K, bf = 128, torch.bfloat16
    slots = 2 * B + 3
    gen = torch.Generator(device=DEV).manual_seed(1000 * B + 10 * T + len(mode))
    backing0 = (torch.randn(slots, 2 * HV if kind == "strided" else HV, V, K, device=DEV, generator=gen) * 0.1).to(bf)
    idx = torch.randperm(slots, device=DEV, generator=gen)[:B].to(torch.int32)
    idx[1] = -1  # a padding row
    accs = [torch.randint(0, T + 1, (B,), device=DEV, dtype=torch.int32, generator=gen) for _ in range(2)]
    steps = [_inputs(B, T, H, HV, K, V, seed=10 * B + T + i) for i in range(2)]
    got = {}
    for tile in (64, 128):
        backing = backing0.clone()
        pool = backing[:, ::2] if kind == "strided" else backing  # strided: every other head of a bigger pool
        outs, extra = [], []
        with forcing({"form": "tc", "tile_v": tile}):
            if mode == "spec_step":
                cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=DEV)
                for x in cache[:4]:  # the first step's replayed drafts read defined values
                    x.zero_()
                for (q, k, v, A_log, a, dt_bias, b), acc in zip(steps, accs):
                    outs.append(gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dt_bias, b, pool, idx, acc, cache))
                extra = list(cache)
            elif mode == "commit":
                g2 = torch.Generator(device=DEV).manual_seed(T)
                rawv = torch.randn(1, slots, HV, T, V, device=DEV, generator=g2).to(bf)
                rawk = torch.randn(1, slots, H, T, K, device=DEV, generator=g2).to(bf)
                gc = -torch.rand(1, slots, HV, T, device=DEV, generator=g2) * 2
                bc = torch.rand(1, slots, HV, T, device=DEV, generator=g2)
                for acc in accs:
                    gdnjit.gated_delta_rule_replayssm_commit(pool[None], rawv, rawk, gc, bc, idx, acc)
            else:
                for q, k, v, A_log, a, dt_bias, b in steps:
                    out = torch.full((B, T, HV, V), float("nan"), device=DEV, dtype=bf)
                    gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, output=out,
                                                disable_state_update=False)
                    outs.append(out)
            torch.cuda.synchronize()
        got[tile] = [x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32) for x in [backing, *outs, *extra]]
    assert all(torch.equal(x, y) for x, y in zip(got[64], got[128]))
    assert not torch.equal(got[128][0], backing0.view(torch.int16))  # the state was written
    if kind == "strided":  # the other heads untouched
        assert torch.equal(got[128][0][:, 1::2], backing0[:, 1::2].view(torch.int16))


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [3, 8])
@pytest.mark.parametrize("mode", ["update", "cache", "spec_step"])
def test_tc_v_rows_off_16_byte_alignment_give_the_aligned_bits(mode, T, state_dtype):
    """The tc form copies v rows 16 bytes at a time where v's base and strides allow it, element by element otherwise
    (v need only be 2-byte aligned): a v view 2 bytes off 16-byte alignment (ReplaySSM's caching verify, which takes
    aligned bases only: an odd token stride) gives the contiguous tensor's bits, for the state-updating multi-token
    call, ReplaySSM's caching verify and the fused step (an fp32 state's step keeps v in registers), with a padding
    row."""
    from gdn_cases import forcing

    B, H, HV, K, V = 19, 4, 8, 128, 128
    bf, nan = torch.bfloat16, float("nan")
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=100 + T)
    if mode == "cache":  # FlashInfer's ReplaySSM contract: 16-byte aligned bases; an odd token stride instead
        v_odd = torch.empty(B, T, HV * V + 1, device=DEV, dtype=bf)[..., :HV * V].unflatten(-1, (HV, V))
    else:
        v_odd = torch.empty(v.numel() + 1, device=DEV, dtype=bf)[1:].view(v.shape)
    v_odd.copy_(v)
    assert v_odd.data_ptr() % 16 == (0 if mode == "cache" else 2) and v_odd.stride(1) % 8 == (1 if mode == "cache" else 0)
    slots = 2 * B + 3
    pool0 = (torch.randn(slots, HV, V, K, device=DEV) * 0.1).to(state_dtype)
    idx = torch.randperm(slots, device=DEV)[:B].to(torch.int32)
    idx[2] = -1  # a padding row
    acc = torch.randint(0, T + 1, (B,), device=DEV, dtype=torch.int32)
    got = []
    for vv in (v, v_odd):
        pool = pool0.clone()
        out = torch.full((B, T, HV, V), nan, device=DEV, dtype=bf)
        with forcing({"form": "tc", "tile_v": 64}):
            if mode == "spec_step":
                cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=DEV)
                for x in cache[:4]:  # the replayed drafts (acc of them) read defined values
                    x.zero_()
                gdnjit.gated_delta_rule_spec_step(q, k, vv, A_log, a, dt_bias, b, pool, idx, acc, cache, output=out)
                extra = list(cache)
            elif mode == "cache":
                extra = [torch.full((slots, HV, T, V), nan, device=DEV, dtype=bf),
                         torch.full((slots, H, T, K), nan, device=DEV, dtype=bf),
                         torch.full((slots, HV, T), nan, device=DEV), torch.full((slots, HV, T), nan, device=DEV)]
                gdnjit.gated_delta_rule_mtp(q, k, vv, pool, idx, A_log, a, dt_bias, b, output=out,
                                            disable_state_update=True, cache_replayssm=True, replayssm_rawv=extra[0],
                                            replayssm_rawk=extra[1], replayssm_g=extra[2], replayssm_beta=extra[3])
            else:
                extra = []
                gdnjit.gated_delta_rule_mtp(q, k, vv, pool, idx, A_log, a, dt_bias, b, output=out,
                                            disable_state_update=False)
            torch.cuda.synchronize()
        got.append([x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32) for x in [out, pool, *extra]])
    assert all(torch.equal(x, y) for x, y in zip(*got))
    if mode == "update":  # and the values are right
        ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool0.double(), read_indices=idx)
        live = idx >= 0
        tol = 2e-3 if state_dtype == torch.float32 else 2e-2
        out = got[1][0].view(bf)
        assert (out[live].double() - ref.output[live]).norm() / ref.output[live].norm() < tol

def _strided(x, step):
    """x's values as a view with stride ``step`` into a bigger buffer (FlashInfer's strided A_log / dt_bias)."""
    backing = torch.full((x.numel() * step,), float("nan"), device=x.device, dtype=x.dtype)
    view = backing[::step]
    view.copy_(x)
    return view


@pytest.mark.parametrize("form", ["rule", "recurrent", "tc", "mma", "pipe", "decode", "spec_step", "engine"])
@pytest.mark.parametrize("dtb_dtype", [torch.float32, torch.bfloat16])
def test_strided_gate_params_give_the_contiguous_bits(form, dtb_dtype):
    """A_log / dt_bias as strided [HV] views (the other elements NaN): the same bits as contiguous ones, in every
    form and entry point that reads them."""
    from gdn_cases import forcing

    B, T, H, HV, K, V = 6, 1 if form == "decode" else 4, 2, 8, 128, 128
    q, k, v, A_log, a, dt_bias, b = _inputs(B, T, H, HV, K, V, seed=41)
    dt_bias = dt_bias.to(dtb_dtype)
    pool0 = torch.randn(B + 3, HV, V, K, device=DEV) * 0.1
    idx = torch.tensor([4, -1, 0, 7, 2, 8], device=DEV, dtype=torch.int32)
    override = {"rule": None, "recurrent": {"form": "recurrent", "pipe": 1}, "tc": {"form": "tc"},
                "mma": {"form": "mma"}, "pipe": {"pipe": 2}}.get(form)

    def run(al, db):
        pool = pool0.clone()
        if form == "spec_step":
            cache = gdnjit.spec_cache(B + 3, H, HV, T, K, V, dtype=torch.bfloat16, device=DEV)
            acc = torch.zeros(B, dtype=torch.int32, device=DEV)
            outs = []
            for _ in range(2):  # the second step replays the first one's tokens (their g from A_log / dt_bias)
                outs.append(gdnjit.gated_delta_rule_spec_step(q, k, v, al, a, db, b, pool, idx, acc, cache))
                acc = torch.tensor([4, 0, 2, 1, 3, 4], device=DEV, dtype=torch.int32)
            return torch.cat(outs), pool
        if form == "engine":
            from gdnjit.compat import sglang

            out = sglang.fused_sigmoid_gating_delta_rule_update(
                A_log=al, a=a.reshape(B * T, HV), dt_bias=db, softplus_beta=1.0, softplus_threshold=20.0,
                q=q.reshape(1, B * T, H, K), k=k.reshape(1, B * T, H, K), v=v.reshape(1, B * T, HV, V),
                b=b.reshape(B * T, HV), initial_state_source=pool, initial_state_indices=idx, use_qk_l2norm_in_kernel=True,
                cu_seqlens=torch.arange(0, B * T + 1, T, device=DEV, dtype=torch.int32))
            return out, pool
        if form == "decode":
            out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, al, a, db, b, initial_state=pool,
                                                                 initial_state_indices=idx)
            return out, pool
        with (forcing(override) if override else contextlib.nullcontext()):
            out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, al, a, db, b, disable_state_update=False)
        return out, pool

    want = run(A_log, dt_bias)
    got = run(_strided(A_log, 3), _strided(dt_bias, 2))
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.isnan(want[0].float()).any()
