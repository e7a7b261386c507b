"""Torch reference of the decode-time causal conv1d update (docs/design.md section 10), any precision.

A plain loop over requests and tokens, written from the contract rather than from the kernel: the
conv-state window of each request, the convolution, the optional silu, and the state columns the
call writes (vLLM's ``causal_conv1d_update``: effective state length ``W - 1``, or ``W - 2 + T``
with ``num_accepted_tokens``; varlen requests shorter than ``max_query_len`` write fewer columns).
"""

from __future__ import annotations

import torch


def conv_reference(x, conv_state, weight, bias=None, silu: bool = False, conv_state_indices=None,
                   num_accepted_tokens=None, query_start_loc=None, max_query_len: int = -1,
                   pad_slot_id: int = -1, dtype=torch.float64):
    """(out, new_state): ``out`` like ``x`` in ``dtype`` (padding rows 0), ``new_state`` a new tensor in the
    state's dtype.

    ``x``: ``[B, D]``, ``[B, D, T]``, or varlen ``[tokens, D]`` with ``query_start_loc [B + 1]`` (then
    ``conv_state_indices`` gives B and ``max_query_len`` is T). ``conv_state``: ``[slots, D, state_len]``.
    ``weight``: ``[D, W]``. Rounding points of the kernels that a float64 reference keeps: x is rounded
    to the state dtype first, the output passes through the state dtype (vLLM converts the same way).
    """
    sdt = conv_state.dtype
    D, W = weight.shape
    varlen = query_start_loc is not None
    if varlen:
        B, T = conv_state_indices.shape[0], max_query_len
        starts = [int(v) for v in query_start_loc.tolist()]
    else:
        B = x.shape[0]
        T = 1 if x.dim() == 2 else x.shape[2]
    spec = num_accepted_tokens is not None
    cols = W - 2 + T if spec else W - 1
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    new_state = conv_state.clone()
    w = weight.to(dtype)
    b = bias.to(dtype) if bias is not None else torch.zeros(D, dtype=dtype, device=x.device)
    for n in range(B):
        slot = int(conv_state_indices[n]) if conv_state_indices is not None else n
        if slot < 0 or slot == pad_slot_id:
            continue
        if varlen:
            L = starts[n + 1] - starts[n]
            xs = x[starts[n]:starts[n + 1]].T  # [D, L]
        else:
            L = T
            xs = x[n].reshape(D, T)
        if L == 0:
            continue
        off = int(num_accepted_tokens[n]) - 1 if spec else 0
        xs = xs.to(sdt).to(dtype)  # x.to(conv_state.dtype)
        hist = conv_state[slot, :, off:off + W - 1].to(dtype)
        u = torch.cat([hist, xs], dim=1)  # [D, W - 1 + L]
        o = torch.stack([b + (w * u[:, t:t + W]).sum(1) for t in range(L)], dim=1)
        if silu:
            o = o * torch.sigmoid(o)
        o = o.to(sdt).to(dtype)
        if varlen:
            out[starts[n]:starts[n + 1]] = o.T
        else:
            out[n] = o.reshape(out[n].shape)
        cols_n = cols - (T - L)
        keep = cols - T
        shift = 1 if spec else L
        for i in range(max(cols_n, 0)):
            col = hist[:, i + shift] if i < keep else xs[:, i - keep]
            new_state[slot, :, i] = col.to(sdt)
    return out, new_state
