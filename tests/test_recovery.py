"""gdnjit/recovery.py on the CPU: the per-token write map of FlashInfer's state-recovery arguments, their errors, and
the torch op's CPU path (the torch reference) against a per-request chain of plain calls."""

from __future__ import annotations

import pytest
import torch

import gdnjit.torch_ops as ops
from gdnjit import recovery
from gdnjit.errors import DtypeError

B, T, H, HV, K = 5, 4, 2, 4, 64


def _q(b=B, t=T):
    return torch.zeros(b, t, H, K, dtype=torch.bfloat16)


def test_accepted_steps_write_each_request_once_at_its_step():
    read = torch.tensor([3, 7, -1, 0, 9], dtype=torch.int32)
    acc = torch.tensor([0, 3, 1, 2, 0], dtype=torch.int32)
    r = recovery.plan(_q(), read, None, None, None, False, acc, 0, False)
    assert r.write_idx is None and not r.scratch_output
    assert r.ssm.dtype == torch.int32 and r.ssm.is_contiguous()
    assert r.ssm.tolist() == [[3, -1, -1, -1], [-1, -1, -1, 7], [-1, -1, -1, -1], [-1, -1, 0, -1], [9, -1, -1, -1]]
    write = torch.tensor([10, 11, 12, 13, 14], dtype=torch.int32)
    r = recovery.plan(_q(), read, write, None, None, False, acc, 0, 1)
    assert r.scratch_output and r.ssm[1].tolist() == [-1, -1, -1, 11]


def test_accepted_steps_with_the_scatter_keep_the_accepted_columns():
    read = torch.arange(B, dtype=torch.int64)
    ssm = torch.arange(B * T, dtype=torch.int64).view(B, T) + 10
    acc = torch.tensor([0, 3, 1, 2, 0])
    r = recovery.plan(_q(), read, None, ssm, None, False, acc, 0, False)
    assert r.ssm.dtype == torch.int64
    assert r.ssm.tolist() == [[10, -1, -1, -1], [14, 15, 16, 17], [18, 19, -1, -1], [22, 23, 24, -1], [26, -1, -1, -1]]


def test_recovery_steps_and_the_frozen_pool():
    read = torch.tensor([4, 5, 6, 7, 8], dtype=torch.int32)
    r = recovery.plan(_q(), read, None, None, None, False, None, 2, False)
    assert r.ssm.tolist() == [[-1, s, -1, -1] for s in (4, 5, 6, 7, 8)]
    r = recovery.plan(_q(), read, None, None, None, False, None, T, False)  # after the last token: the plain update
    assert r.ssm is None and r.write_idx is None and not r.write_once
    write = read + 10
    r = recovery.plan(_q(), read, write, None, None, False, None, T, False)
    assert r.ssm is None and r.write_idx is write
    r = recovery.plan(_q(t=1), read, write, None, None, False, torch.zeros(B, dtype=torch.int32), 0, False)
    assert r.ssm is None and r.write_idx is write  # T = 1: the only step is 0, the plain update
    acc = torch.zeros(B, dtype=torch.int32)
    r = recovery.plan(_q(), read, None, None, None, True, acc, 0, False)  # nothing is written either way
    assert r.ssm is None and r.write_idx is None
    r = recovery.plan(_q(), read, None, None, None, False, None, 0, False)  # nothing asked: unchanged
    assert r.ssm is None


@pytest.mark.parametrize("kw,err,text", [
    (dict(recovery_steps=True), TypeError, "recovery_steps: expected an int, got bool"),
    (dict(recovery_steps=1.0), TypeError, "recovery_steps: expected an int, got float"),
    (dict(recovery_steps=T + 1), ValueError, f"recovery_steps: expected 0..T={T}, got {T + 1}"),
    (dict(recovery_steps=-1), ValueError, "recovery_steps: expected 0..T"),
    (dict(recovery_steps=1, frozen=True), ValueError, "disable_state_update must be False"),
    (dict(recovery_steps=1, inter=True), ValueError, "recovery_steps: not with intermediate_states_buffer"),
    (dict(recovery_steps=1, ssm=True), ValueError, "recovery_steps: not with ssm_state_indices"),
    (dict(recovery_steps=1, acc=True), ValueError, "recovery_steps: not with accepted_steps"),
    (dict(disable_output=0.0), TypeError, "disable_output: expected a bool or an int, got float"),
    (dict(acc=torch.zeros(B)), DtypeError, "accepted_steps: expected dtype int32, int64, got float32"),
    (dict(acc=torch.zeros(B - 1, dtype=torch.int32)), ValueError, "accepted_steps: expected shape [B]"),
    (dict(acc=torch.zeros(B, 1, dtype=torch.int32)), ValueError, "accepted_steps"),
    (dict(acc=True, inter=True), NotImplementedError, "accepted_steps: with intermediate_states_buffer"),
    (dict(acc=True, write=torch.zeros(B, dtype=torch.int64)), DtypeError, "output_state_indices: expected the same dtype"),
])
def test_errors_name_the_argument(kw, err, text):
    acc = kw.get("acc")
    if acc is True:
        acc = torch.zeros(B, dtype=torch.int32)
    inter = torch.zeros(B, T, HV, K, K) if kw.get("inter") else None
    ssm = torch.zeros(B, T, dtype=torch.int32) if kw.get("ssm") else None
    with pytest.raises(err) as e:
        recovery.plan(_q(), torch.arange(B, dtype=torch.int32), kw.get("write"), ssm, inter, kw.get("frozen", False),
                      acc, kw.get("recovery_steps", 0), kw.get("disable_output", False))
    assert text in str(e.value) and "\n" not in str(e.value)


def test_check_indices_reads_the_steps_on_the_host():
    import dataclasses

    from gdnjit import config

    before = config.get_config()
    config.set_config(dataclasses.replace(before, check_indices=True))
    try:
        with pytest.raises(IndexError, match=r"accepted_steps: expected values in 0..T-1=3, got 4"):
            recovery.plan(_q(), torch.arange(B, dtype=torch.int32), None, None, None, False,
                          torch.tensor([0, 1, 4, 2, 0], dtype=torch.int32), 0, False)
        with pytest.raises(IndexError, match=r"accepted_steps: expected values in 0..T-1=3, got -1"):
            recovery.plan(_q(), torch.arange(B, dtype=torch.int32), None, None, None, False,
                          torch.tensor([0, 1, -1, 2, 0], dtype=torch.int32), 0, False)
    finally:
        config.set_config(before)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    c = lambda *s: torch.randn(*s, generator=g).bfloat16()  # noqa: E731
    return dict(q=c(B, T, H, K), k=c(B, T, H, K), v=c(B, T, HV, K), a=c(B, T, HV), b=c(B, T, HV),
                A_log=torch.rand(HV, generator=g), dt_bias=torch.randn(HV, generator=g))


def _mtp(x, pool, read, sl=slice(None), **kw):
    cut = lambda t: t[:, sl].contiguous()  # noqa: E731
    return ops.gated_delta_rule_mtp(cut(x["q"]), cut(x["k"]), cut(x["v"]), pool, read, x["A_log"], cut(x["a"]),
                                    x["dt_bias"], cut(x["b"]), **kw)[0]


def test_cpu_fused_recovery_equals_two_plain_calls_per_request():
    """FlashInfer's fused mode on the torch reference: h_{K_n} in the write slot (nothing else written) and the outputs
    of tokens K_n.. as a second call from h_{K_n} gives them."""
    x = _inputs()
    pool0 = torch.randn(B + 2, HV, K, K)
    read = torch.arange(B, dtype=torch.int32)
    acc = torch.tensor([0, 3, 1, 2, 0], dtype=torch.int32)
    pool = pool0.clone()
    out = _mtp(x, pool, read, accepted_steps=acc, disable_state_update=False)
    for n in range(B):
        k_n = int(acc[n]) + 1
        one = {key: (val[n:n + 1] if val.dim() > 1 else val) for key, val in x.items()}
        p = pool0[n:n + 1].clone()
        head = _mtp(one, p, torch.zeros(1, dtype=torch.int32), slice(0, k_n), disable_state_update=False)
        torch.testing.assert_close(pool[n], p[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[n, :k_n], head[0], atol=1e-2, rtol=1e-2)
        if k_n < T:
            tail = _mtp(one, p, torch.zeros(1, dtype=torch.int32), slice(k_n, T), disable_state_update=True)
            torch.testing.assert_close(out[n, k_n:], tail[0], atol=1e-2, rtol=1e-2)
    assert torch.equal(pool[B:], pool0[B:])


def test_cpu_disable_output_leaves_the_callers_output():
    x = _inputs(1)
    pool = torch.randn(B, HV, K, K)
    out = torch.full((B, T, HV, K), 7.0, dtype=torch.bfloat16)
    got, _ = ops.gated_delta_rule_mtp(x["q"], x["k"], x["v"], pool, torch.arange(B, dtype=torch.int32), x["A_log"],
                                      x["a"], x["dt_bias"], x["b"], output=out, disable_state_update=False,
                                      disable_output=True, recovery_steps=2)
    assert got is out and bool((out == 7).all())
    with pytest.raises(ValueError, match="output: expected shape"):
        ops.gated_delta_rule_mtp(x["q"], x["k"], x["v"], pool, torch.arange(B, dtype=torch.int32), x["A_log"], x["a"],
                                 x["dt_bias"], x["b"], output=out[:, :2], disable_state_update=False,
                                 disable_output=True)


def test_not_with_the_replay_cache():
    x = _inputs(2)
    with pytest.raises(ValueError, match="accepted_steps, recovery_steps, disable_output: not with cache_replayssm"):
        ops.gated_delta_rule_mtp(x["q"], x["k"], x["v"], torch.zeros(B, HV, K, K), torch.arange(B, dtype=torch.int32),
                                 x["A_log"], x["a"], x["dt_bias"], x["b"], disable_state_update=True,
                                 cache_replayssm=True, replayssm_rawv=torch.zeros(1), replayssm_rawk=torch.zeros(1),
                                 replayssm_g=torch.zeros(1), replayssm_beta=torch.zeros(1), disable_output=True)


@pytest.mark.parametrize("state_dtype,T,as_update", [("bf16", 2, True), ("bf16", 8, True), ("fp32", 3, True),
                                                     ("fp32", 16, True), ("fp32", 2, False)])
def test_a_recovery_map_dispatches_as_the_plain_update(state_dtype, T, as_update):
    """A recovery call's map writes one state per request: the rules see the plain update of its shape (the verify
    with T stored states only for an fp32 state at T = 2, where its variant measured faster: docs/perf.md v53)."""
    from gdnjit.gdn import NATIVE_CONVENTIONS
    from gdnjit.spec import get_spec

    spec = get_spec("gdn")
    base = dict(layout="klast", K=128, V=128, T=T, in_dtype="bf16", out_dtype="bf16", state_dtype=state_dtype,
                dtb_dtype="fp32", pool=True, idx_dtype="int32", same_pool=True, inter_dtype="none", update=True,
                l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS)
    once = spec.dispatch_view(dict(base, ssm_idx_dtype="int32", write_once=True))
    plain = spec.dispatch_view(dict(base, ssm_idx_dtype="none"))
    scatter = spec.dispatch_view(dict(base, ssm_idx_dtype="int32"))
    assert (once == plain) is as_update and (once == scatter) is not as_update
