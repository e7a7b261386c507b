"""The replay-commit reference (gdnjit/reference/replay.py) against the GDN reference run token by token: replaying
the first n cached tokens of a verify step into the checkpoint gives the state the step had after token n."""

from __future__ import annotations

import pytest
import torch

from gdnjit.reference.gdn import gates, gdn_reference
from gdnjit.reference.replay import replay_commit_reference


def _verify_step(L, slots, B, T, H, HV, K, V, seed):
    """Random inputs of one verify step over L layers, the caches FlashInfer's verify writes, and the states the
    GDN reference passes through (per layer: [B, T, HV, V, K] after each token)."""
    g = torch.Generator().manual_seed(seed)
    ckpt = torch.randn(L, slots, HV, V, K, generator=g, dtype=torch.float64)
    idx = torch.randperm(slots, generator=g)[:B]
    rawv = torch.zeros(L, slots, HV, T, V, dtype=torch.float64)
    rawk = torch.zeros(L, slots, H, T, K, dtype=torch.float64)
    gc = torch.zeros(L, slots, HV, T, dtype=torch.float64)
    bc = torch.zeros(L, slots, HV, T, dtype=torch.float64)
    after = []
    for layer in range(L):
        q = torch.randn(B, T, H, K, generator=g, dtype=torch.float64)
        k = torch.randn(B, T, H, K, generator=g, dtype=torch.float64)
        v = torch.randn(B, T, HV, V, generator=g, dtype=torch.float64)
        a = torch.randn(B, T, HV, generator=g, dtype=torch.float64)
        b = torch.randn(B, T, HV, generator=g, dtype=torch.float64)
        A_log, dt_bias = torch.rand(HV, generator=g, dtype=torch.float64), torch.randn(HV, generator=g, dtype=torch.float64)
        decay, beta = gates(a, b, A_log, dt_bias)
        inter = torch.zeros(B, T, HV, V, K, dtype=torch.float64)
        ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, ckpt[layer], read_indices=idx, intermediate=inter,
                            disable_state_update=True)
        after.append(ref.intermediate)
        rawv[layer, idx] = v.transpose(1, 2)
        rawk[layer, idx] = k.transpose(1, 2)
        gc[layer, idx] = torch.log(decay).transpose(1, 2)
        bc[layer, idx] = beta.transpose(1, 2)
    return ckpt, idx, rawv, rawk, gc, bc, after


@pytest.mark.parametrize("T", [1, 3, 8])
def test_commit_of_n_tokens_is_the_state_after_token_n(T):
    L, slots, B, H, HV, K, V = 2, 9, 5, 2, 4, 16, 8
    ckpt, idx, rawv, rawk, gc, bc, after = _verify_step(L, slots, B, T, H, HV, K, V, seed=T)
    accept = torch.tensor([0, T, 1, T // 2 + 1, T][:B])
    got = replay_commit_reference(ckpt, rawv, rawk, gc, bc, idx, accept)
    for layer in range(L):
        for i in range(B):
            slot, n = int(idx[i]), int(accept[i])
            want = ckpt[layer, slot] if n == 0 else after[layer][i, n - 1]
            assert torch.allclose(got[layer, slot], want, rtol=1e-12, atol=1e-12), (layer, i, n)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[idx] = False
    assert torch.equal(got[:, untouched], ckpt[:, untouched])


def test_null_blocks_tracking_and_bad_lengths():
    L, slots, B, T, H, HV, K, V = 1, 8, 3, 4, 1, 2, 8, 8
    ckpt, idx, rawv, rawk, gc, bc, after = _verify_step(L, slots, B, T, H, HV, K, V, seed=11)
    accept = torch.tensor([4, 2, 3])
    free = [s for s in range(slots) if s not in idx.tolist()]
    track_slots = torch.tensor(free[:3])
    track_steps = torch.tensor([1, 3, 0])  # request 1 accepted 2 tokens: its step 3 is outside, nothing saved
    got = replay_commit_reference(ckpt, rawv, rawk, gc, bc, idx, accept, track_state_indices=track_slots,
                                  track_steps=track_steps)
    assert torch.allclose(got[0, free[0]], after[0][0, 1], rtol=1e-12, atol=1e-12)
    assert torch.equal(got[0, free[1]], ckpt[0, free[1]])
    assert torch.allclose(got[0, free[2]], after[0][2, 0], rtol=1e-12, atol=1e-12)
    # a slot at or below null_block_id is skipped
    skipped = replay_commit_reference(ckpt, rawv, rawk, gc, bc, idx, accept, null_block_id=int(idx.max()))
    assert torch.equal(skipped, ckpt)
    with pytest.raises(ValueError, match="accept_lens: expected 0..4"):
        replay_commit_reference(ckpt, rawv, rawk, gc, bc, idx, torch.tensor([5, 1, 1]))
    with pytest.raises(ValueError, match="track_state_indices and track_steps"):
        replay_commit_reference(ckpt, rawv, rawk, gc, bc, idx, accept, track_steps=track_steps)
