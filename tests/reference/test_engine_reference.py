"""gdnjit.reference.engine against the native reference (gdn_reference) where the conventions coincide, and
against explicit per-request loops where they do not."""

from __future__ import annotations

import torch

from gdnjit.reference.engine import engine_reference
from gdnjit.reference.gdn import gdn_reference

H, HV, K, V = 2, 4, 16, 8


def _inp(N, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(N, T, H, K), r(N, T, H, K), r(N, T, HV, V), r(HV), r(N, T, HV), r(HV), r(N, T, HV), r(10, HV, V, K)


def test_plain_pool_call_equals_native_reference():
    q, k, v, A, a, d, b, pool = _inp(3, 4)
    idx = torch.tensor([7, -1, 2])
    nat = gdn_reference(q, k, v, A, a, d, b, pool, read_indices=idx)
    eng = engine_reference(q, k, v, A, a, d, b, pool, T=4, read_idx=idx)
    assert torch.allclose(nat.output, eng.output, rtol=1e-12, atol=1e-12)
    assert torch.allclose(nat.state, eng.state, rtol=1e-12, atol=1e-12)


def test_varlen_accepted_per_token_writes():
    q, k, v, A, a, d, b, pool = _inp(1, 5)
    cu = torch.tensor([0, 3, 3, 5])
    idx2d = torch.tensor([[1, 2, 3], [4, 5, 6], [0, 8, 9]])
    acc = torch.tensor([2, 1, 1])
    eng = engine_reference(q, k, v, A, a, d, b, pool, T=3, read_idx=idx2d, cu_seqlens=cu, num_accepted=acc,
                           ssm_idx=idx2d, null_slot="nonpositive")
    # request 0: tokens 0..2 from slot 2, states to slots 1, 2, 3
    r0 = gdn_reference(q[:, 0:3], k[:, 0:3], v[:, 0:3], A, a[:, 0:3], d, b[:, 0:3], pool,
                       read_indices=torch.tensor([2]), ssm_state_indices=torch.tensor([[1, 2, 3]]))
    assert torch.allclose(eng.output[:, 0:3], r0.output)
    for s in (1, 2, 3):
        assert torch.allclose(eng.state[s], r0.state[s])
    # request 1 is empty; request 2 reads slot 0 (the null block): skipped, zero outputs, slots 8 and 9 untouched
    assert torch.equal(eng.output[:, 3:5], torch.zeros_like(eng.output[:, 3:5]))
    for s in (0, 4, 5, 6, 7, 8, 9):
        assert torch.equal(eng.state[s], pool[s])


def test_zero_state_padding_and_tree():
    q, k, v, A, a, d, b, pool = _inp(2, 3)
    buf = torch.zeros(2, 3, HV, V, K)
    parent = torch.tensor([[0, 0, 0], [0, 0, 1]])
    eng = engine_reference(q, k, v, A, a, d, b, pool, T=3, read_idx=torch.tensor([-1, 4]), inter=buf,
                           inter_idx=torch.tensor([1, 0]), parent=parent, update=False, padding="zero_state")
    # request 0 from zeros, a tree where tokens 1 and 2 both start from token 0's state
    zero = torch.zeros(1, HV, V, K, dtype=torch.float64)
    t0 = gdn_reference(q[:1, :1], k[:1, :1], v[:1, :1], A, a[:1, :1], d, b[:1, :1], zero)
    s0 = t0.state.float().double()
    for t in (1, 2):
        tt = gdn_reference(q[:1, t:t + 1], k[:1, t:t + 1], v[:1, t:t + 1], A, a[:1, t:t + 1], d, b[:1, t:t + 1], s0)
        assert torch.allclose(eng.output[0, t], tt.output[0, 0])
        assert torch.allclose(eng.intermediate[1, t].double(), tt.state[0].float().double())
    assert torch.equal(eng.state, pool)  # update off
