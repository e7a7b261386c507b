"""The conv1d reference (gdnjit/reference/conv.py) against independent formulations: torch's depthwise
conv1d over history ++ tokens, sequential one-token decoding for speculative steps, and per-request
calls for varlen batches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdnjit.reference.conv import conv_reference

D = 24


def _depthwise(u: torch.Tensor, w: torch.Tensor, b: torch.Tensor, silu: bool) -> torch.Tensor:
    o = F.conv1d(u[None], w[:, None, :], b, groups=u.shape[0])[0]  # [D, len(u) - W + 1]
    return F.silu(o) if silu else o


@pytest.mark.parametrize("W", [2, 3, 4, 6])
@pytest.mark.parametrize("T", [1, 2, 5])
@pytest.mark.parametrize("silu", [False, True])
def test_matches_depthwise_conv1d_and_shifts_the_window(W, T, silu):
    g = torch.Generator().manual_seed(W * 10 + T)
    B, slots = 3, 5
    x = torch.randn(B, D, T, generator=g, dtype=torch.float64)
    state = torch.randn(slots, D, W - 1, generator=g, dtype=torch.float64)
    w, b = torch.randn(D, W, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)
    idx = torch.tensor([4, -1, 1])
    out, new = conv_reference(x, state, w, b, silu, idx)
    for n, slot in enumerate(idx.tolist()):
        if slot < 0:
            assert out[n].abs().max() == 0
            continue
        u = torch.cat([state[slot], x[n]], 1)
        torch.testing.assert_close(out[n], _depthwise(u, w, b, silu), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(new[slot], u[:, -(W - 1):], rtol=0, atol=0)
    for slot in (0, 2, 3):  # untouched slots
        assert torch.equal(new[slot], state[slot])


@pytest.mark.parametrize("W", [2, 4, 5])
@pytest.mark.parametrize("T", [1, 3, 4])
def test_speculative_steps_equal_sequential_decoding(W, T):
    """Verify T drafts, accept k of them, verify T more: the outputs of the second step equal plain
    one-token decoding of the accepted stream (accepted drafts, then the new tokens)."""
    g = torch.Generator().manual_seed(7 * W + T)
    w, b = torch.randn(D, W, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)
    hist = torch.randn(1, D, W - 1, generator=g, dtype=torch.float64)
    spec_state = torch.cat([hist, torch.zeros(1, D, T - 1, dtype=torch.float64)], 2)  # read at offset 0 first
    x1, x2 = (torch.randn(1, D, T, generator=g, dtype=torch.float64) for _ in range(2))
    one = torch.ones(1, dtype=torch.int64)
    _, spec_state = conv_reference(x1, spec_state, w, b, True, num_accepted_tokens=one)
    for k in range(1, T + 1):
        out2, _ = conv_reference(x2, spec_state, w, b, True, num_accepted_tokens=torch.tensor([k]))
        seq_state, outs = hist.clone(), []
        stream = torch.cat([x1[..., :k], x2], 2)
        for t in range(stream.shape[2]):
            o, seq_state = conv_reference(stream[..., t], seq_state, w, b, True)
            outs.append(o)
        torch.testing.assert_close(out2[0], torch.stack(outs[k:], -1)[0], rtol=1e-12, atol=1e-12)


def test_varlen_equals_per_request_calls():
    g = torch.Generator().manual_seed(3)
    W, T, slots = 4, 4, 6
    lens = [2, 0, 4, 1]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    x = torch.randn(starts[-1], D, generator=g, dtype=torch.float64)
    state = torch.randn(slots, D, W - 2 + T, generator=g, dtype=torch.float64)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    idx, acc = torch.tensor([5, 1, 0, -1]), torch.tensor([1, 2, 3, 1])
    out, new = conv_reference(x, state, w, None, False, idx, acc, torch.tensor(starts), T)
    for n, L in enumerate(lens):
        if L == 0 or idx[n] < 0:
            assert out[starts[n]:starts[n + 1]].abs().sum() == 0
            continue
        o, s = conv_reference(x[starts[n]:starts[n + 1]].T[None], state[idx[n]][None], w, None, False,
                              num_accepted_tokens=acc[n:n + 1])
        # a request of L < T tokens writes W - 2 + L columns
        torch.testing.assert_close(out[starts[n]:starts[n + 1]], o[0].T, rtol=0, atol=0)
        torch.testing.assert_close(new[idx[n], :, :W - 2 + L], s[0, :, :W - 2 + L], rtol=0, atol=0)
        assert torch.equal(new[idx[n], :, W - 2 + L:], state[idx[n], :, W - 2 + L:])
    assert torch.equal(new[[2, 3, 4]], state[[2, 3, 4]])
