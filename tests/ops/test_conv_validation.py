"""causal_conv1d_update argument checks on the CPU: each bad argument raises the documented exception with a
message naming it, before any kernel could run (``conv.prepare(require_cuda=False)``); the named call
of a good one; the CPU torch op against the reference."""

from __future__ import annotations

import pytest
import torch

import gdnjit
import gdnjit.torch_ops as ops
from gdnjit import conv
from gdnjit.reference.conv import conv_reference

B, D, W, SLOTS = 3, 64, 4, 5


def inputs(T=1, dtype=torch.bfloat16):
    x = torch.randn(B, D, T, dtype=dtype) if T > 1 else torch.randn(B, D, dtype=dtype)
    return x, torch.randn(SLOTS, D, W - 1, dtype=dtype), torch.randn(D, W, dtype=dtype)


def prep(x, state, w, bias=None, activation="silu", idx=None, acc=None, qsl=None, max_query_len=-1,
         pad_slot_id=-1, out=None):
    return conv.prepare(x, state, w, bias, activation, idx, acc, qsl, max_query_len, pad_slot_id, out,
                         require_cuda=False)


def test_exported():
    assert gdnjit.causal_conv1d_update is conv.causal_conv1d_update
    assert "causal_conv1d_update" in dir(gdnjit)


def test_good_call_names_params_and_args():
    x, state, w = inputs()
    idx = torch.tensor([4, -1, 0], dtype=torch.int64)
    out, call = prep(x, state.transpose(1, 2).contiguous().transpose(1, 2), w, torch.randn(D, dtype=w.dtype),
                     idx=idx)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert dict(call.params) == dict(x_dtype="bf16", state_dtype="bf16", w_dtype="bf16", W=4, T=1, idx_dtype="int64",
                                     acc_dtype="none", qsl_dtype="none", bias=True, silu=True, contig=True)
    assert call.facts == dict(B=B, D=D)
    assert call.args["pool_size"] == SLOTS and call.args["s_dim"] == 1 and call.args["idx"] == idx.data_ptr()
    # a [slots, D, cols] contiguous state has strided channels: no vector access
    assert prep(x, state, w, idx=idx)[1].params["contig"] is False


def test_varlen_strides_and_T():
    _, _, w = inputs()
    x = torch.randn(7, D, dtype=torch.bfloat16)
    state = torch.randn(SLOTS, W - 2 + 4, D, dtype=torch.bfloat16).transpose(1, 2)
    idx, acc = torch.tensor([0, 1, 2], dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    qsl = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    out, call = prep(x, state, w, idx=idx, acc=acc, qsl=qsl, max_query_len=4)
    assert call.params["T"] == 4 and call.params["qsl_dtype"] == "int32" and call.params["acc_dtype"] == "int32"
    assert (call.args["x_sn"], call.args["x_st"], call.args["x_sd"]) == (0, D, 1)
    assert call.params["contig"] is True


@pytest.mark.parametrize("case,exc,match", [
    (lambda x, s, w: prep(x.float().to(torch.int32), s, w), TypeError, r"^x: expected dtype"),
    (lambda x, s, w: prep(x, s.double(), w), TypeError, r"^conv_state: expected dtype"),
    (lambda x, s, w: prep(x, s[0], w), ValueError, r"^conv_state: expected 3 dimensions"),
    (lambda x, s, w: prep(x, s, w[:10]), ValueError, r"^weight: expected shape \[D, W\]"),
    (lambda x, s, w: prep(x, torch.randn(SLOTS, D, 6, dtype=s.dtype), torch.randn(D, 7, dtype=w.dtype)), ValueError,
     r"^weight: expected a kernel width W .* of 2..6, got 7"),
    (lambda x, s, w: prep(x, s, w, bias=torch.randn(D)), TypeError, r"^bias: expected dtype bfloat16"),
    (lambda x, s, w: prep(x, s, w, bias=torch.randn(D + 1, dtype=w.dtype)), ValueError, r"^bias: expected shape"),
    (lambda x, s, w: prep(x, s, w, activation="relu"), ValueError, r"^activation: expected None, a bool"),
    (lambda x, s, w: prep(x, s, w, pad_slot_id=1.5), TypeError, r"^pad_slot_id: expected an int"),
    (lambda x, s, w: prep(x[:, :10], s, w), ValueError, r"^x: expected shape \[B, D\]"),
    (lambda x, s, w: prep(x[None], s, w), ValueError, r"^x: expected shape \[B, D, T\]"),
    (lambda x, s, w: prep(x[..., None].expand(B, D, 65), s, w), ValueError, r"^x: expected 1..64 tokens"),
    (lambda x, s, w: prep(x[..., None][..., :0], s, w), ValueError, r"^x: expected 1..64 tokens per request .*got 0"),
    (lambda x, s, w: prep(x[0], s, w), ValueError, r"^x: expected \[B, D\] or \[B, D, T\]"),
    (lambda x, s, w: prep(x[0, 0], s, w), ValueError, r"^x: expected \[B, D\] or \[B, D, T\]"),
    (lambda x, s, w: prep(x, s, w, pad_slot_id=2 ** 63), ValueError, r"^pad_slot_id: expected an int64"),
    (lambda x, s, w: prep(x, s, w, idx=torch.tensor([0, 1])), ValueError, r"^conv_state_indices: expected shape"),
    (lambda x, s, w: prep(x, s, w, idx=torch.tensor([0.0, 1, 2])), TypeError, r"^conv_state_indices: expected dtype"),
    (lambda x, s, w: prep(x, s[..., :2], w, acc=torch.ones(B, dtype=torch.int32)), ValueError,
     r"^conv_state: expected at least 3 columns \(W - 1\), got shape \(5, 64, 2\)"),
    (lambda x, s, w: prep(x[..., None].expand(B, D, 2), torch.randn(SLOTS, D, 3, dtype=s.dtype), w,
                          acc=torch.ones(B, dtype=torch.int32)), ValueError,
     r"^conv_state: expected at least 4 columns \(W - 1 \+ T - 1\)"),
    (lambda x, s, w: prep(x, s, w, acc=torch.ones(B, 2, dtype=torch.int32)), ValueError,
     r"^num_accepted_tokens: expected 1 dimensions"),
    (lambda x, s, w: prep(x, s[:2], w), ValueError, r"^conv_state: expected a slot per request \(3\)"),
    (lambda x, s, w: prep(x, s, w, qsl=torch.tensor([0, 1, 2, 3])), ValueError, r"^conv_state_indices: required"),
    (lambda x, s, w: prep(x, s, w, idx=torch.arange(B), qsl=torch.tensor([0, 1, 2, 3])), ValueError,
     r"^max_query_len: expected an int >= 1"),
    (lambda x, s, w: prep(x, s, w, idx=torch.arange(B), qsl=torch.tensor([0, 1, 3]), max_query_len=2), ValueError,
     r"^query_start_loc: expected shape \[B \+ 1\]"),
    (lambda x, s, w: prep(x, s, w, out=torch.empty(B, D)), TypeError, r"^out: expected dtype bfloat16"),
    (lambda x, s, w: prep(x, s, w, out=torch.empty(B, D + 1, dtype=x.dtype)), ValueError, r"^out: expected shape"),
    (lambda x, s, w: prep(x, s, w, out=torch.empty(1, D, dtype=x.dtype).expand(B, D)), ValueError,
     r"^out: elements overlap"),
    (lambda x, s, w: conv.causal_conv1d_update(x, s, w, initial_state_idx=torch.zeros(B, dtype=torch.int32)),
     NotImplementedError, r"initial_state_idx is not supported"),
    (lambda x, s, w: conv.causal_conv1d_update(x, s, w, retrieve_parent_token=torch.zeros(B, 2)),
     NotImplementedError, r"retrieve_parent_token is not supported"),
    (lambda x, s, w: conv.causal_conv1d_update(x, s, w), ValueError, r"^x: expected a CUDA tensor"),
])
def test_bad_argument(case, exc, match):
    with pytest.raises(exc, match=match):
        case(*inputs())


@pytest.mark.parametrize("T,spec", [(1, False), (3, False), (3, True)])
def test_cpu_torch_op_matches_reference(T, spec):
    x, _, w = inputs(T, torch.float32)
    state = torch.randn(SLOTS, D, W - 2 + T if spec else W - 1)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    acc = torch.tensor([1, 1, T], dtype=torch.int32) if spec else None
    want_out, want_state = conv_reference(x, state, w, None, True, idx, acc, dtype=torch.float32)
    out = ops.causal_conv1d_update(x, state, w, None, "silu", idx, acc)
    assert torch.equal(out, want_out.to(x.dtype)) and torch.equal(state, want_state)
    with pytest.raises(ValueError, match="^out: the torch op cannot write into x"):
        ops.causal_conv1d_update(x, state, w, out=x)
