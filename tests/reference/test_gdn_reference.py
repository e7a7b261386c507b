"""The torch GDN reference against an independent scalar float64 formulation (plain Python loops,
math module, the textbook update S' = gS + beta (v - gS k) k^T), plus its pool semantics."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gdnjit.reference.gdn import gdn_reference


def scalar_step(S, q, k, v, A_log, a, dt_bias, b, scale, l2norm, beta_sp=1.0, thr=20.0):
    """One token for one head; S is a V x K list of lists (modified copy returned), q/k/v lists."""
    Vd, Kd = len(S), len(S[0])
    x = a + dt_bias
    sp = x if beta_sp * x > thr else math.log1p(math.exp(beta_sp * x)) / beta_sp
    g = math.exp(-math.exp(A_log) * sp)
    beta = 1.0 / (1.0 + math.exp(-b))
    if l2norm:
        nq = 1.0 / math.sqrt(sum(t * t for t in q) + 1e-6)
        nk = 1.0 / math.sqrt(sum(t * t for t in k) + 1e-6)
    else:
        nq = nk = 1.0
    qh = [t * nq * scale for t in q]
    kh = [t * nk for t in k]
    out = []
    new = []
    for i in range(Vd):
        gs = [g * S[i][j] for j in range(Kd)]
        pred = sum(gs[j] * kh[j] for j in range(Kd))
        row = [gs[j] + beta * (v[i] - pred) * kh[j] for j in range(Kd)]
        new.append(row)
        out.append(sum(row[j] * qh[j] for j in range(Kd)))
    return new, out


@pytest.mark.parametrize("l2norm", [True, False])
@pytest.mark.parametrize("T", [1, 3])
def test_reference_matches_scalar_formulation(l2norm, T):
    torch.manual_seed(T + 10 * l2norm)
    B, H, HV, K, V = 2, 1, 2, 4, 3
    q = torch.randn(B, T, H, K, dtype=torch.float64)
    k = torch.randn(B, T, H, K, dtype=torch.float64)
    v = torch.randn(B, T, HV, V, dtype=torch.float64)
    a = torch.randn(B, T, HV, dtype=torch.float64) * 3
    a[0, 0, 0] = 25.0  # past the softplus threshold
    b = torch.randn(B, T, HV, dtype=torch.float64)
    A_log = torch.rand(HV, dtype=torch.float64)
    dt_bias = torch.randn(HV, dtype=torch.float64)
    state = torch.randn(B, HV, V, K, dtype=torch.float64)
    scale = 0.7
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, state, scale=scale, use_qk_l2norm=l2norm)
    for n in range(B):
        for hv in range(HV):
            S = state[n, hv].tolist()
            for t in range(T):
                S, o = scalar_step(S, q[n, t, 0].tolist(), k[n, t, 0].tolist(), v[n, t, hv].tolist(),
                                   float(A_log[hv]), float(a[n, t, hv]), float(dt_bias[hv]), float(b[n, t, hv]),
                                   scale, l2norm)
                assert torch.allclose(ref.output[n, t, hv], torch.tensor(o, dtype=torch.float64), rtol=1e-12, atol=1e-12)
            assert torch.allclose(ref.state[n, hv], torch.tensor(S, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_gva_head_mapping_and_kmajor_is_transpose():
    torch.manual_seed(3)
    B, T, H, HV, K, V = 2, 2, 2, 6, 8, 5
    args = [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), torch.rand(HV),
            torch.randn(B, T, HV), torch.randn(HV), torch.randn(B, T, HV)]
    st = torch.randn(B, HV, V, K, dtype=torch.float64)
    r1 = gdn_reference(*args, st)
    r2 = gdn_reference(*args, st.transpose(-1, -2).contiguous(), layout="kmajor")
    assert torch.allclose(r1.output, r2.output) and torch.allclose(r1.state, r2.state.transpose(-1, -2))
    # value head hv uses q/k head hv // (HV // H): heads 0..2 share q head 0
    q, k = args[0].clone(), args[1].clone()
    q[:, :, 1] += 5.0
    r3 = gdn_reference(q, k, *args[2:], st)
    assert torch.allclose(r3.output[:, :, :3], r1.output[:, :, :3]) and not torch.allclose(r3.output[:, :, 3:], r1.output[:, :, 3:])


def test_pool_semantics():
    torch.manual_seed(4)
    B, T, H, HV, K, V = 4, 2, 1, 1, 4, 4
    args = [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), torch.rand(HV),
            torch.randn(B, T, HV), torch.randn(HV), torch.randn(B, T, HV)]
    pool = torch.randn(12, HV, V, K, dtype=torch.float64)
    read = torch.tensor([5, -1, 2, 9])
    write = torch.tensor([0, 3, -1, 11])
    r = gdn_reference(*args, pool, read_indices=read, write_indices=write)
    assert (r.output[1] == 0).all()  # padding row
    untouched = [s for s in range(12) if s not in (0, 11)]
    assert torch.equal(r.state[untouched], pool[untouched])  # read slots and the skipped write untouched
    direct = gdn_reference(*[x[[0]] if x.dim() > 1 else x for x in args], pool[[5]])
    assert torch.allclose(r.state[0], direct.state[0]) and torch.allclose(r.output[0], direct.output[0])
    inter = torch.full((B, T + 1, HV, V, K), float("nan"), dtype=torch.float64)
    rv = gdn_reference(*args, pool, read_indices=read, intermediate=inter, disable_state_update=True)
    assert torch.equal(rv.state, pool)
    assert torch.allclose(rv.intermediate[0, T - 1], r.state[0])  # last step == final state
    assert torch.isnan(rv.intermediate[1]).all() and torch.isnan(rv.intermediate[:, T]).all()
    ssm = torch.tensor([[6, 7], [1, 1], [8, -1], [10, 4]])
    rs = gdn_reference(*args, pool, read_indices=read, ssm_state_indices=ssm)
    assert torch.allclose(rs.state[7], r.state[0]) and torch.equal(rs.state[5], pool[5])
    assert torch.equal(rs.state[1], pool[1])  # padding row writes nothing
    assert torch.allclose(rs.state[8], rv.intermediate[2, 0])


def test_bf16_state_rounded_once_per_write():
    torch.manual_seed(5)
    B, T, H, HV, K, V = 1, 3, 1, 1, 8, 8
    args = [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), torch.rand(HV),
            torch.randn(B, T, HV), torch.randn(HV), torch.randn(B, T, HV)]
    st = torch.randn(B, HV, V, K).to(torch.bfloat16)
    r = gdn_reference(*args, st)
    exact = gdn_reference(*args, st.double())
    assert r.state.dtype == torch.bfloat16
    assert torch.equal(r.state, exact.state.to(torch.bfloat16))
