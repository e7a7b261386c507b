"""Decode-time causal conv1d over a conv-state pool, with vLLM's ``causal_conv1d_update`` signature.

This module only validates arguments and builds a named :class:`~gdnjit.runner.KernelCall` of the
``causal_conv1d_update`` spec (``specs/causal_conv1d_update.yaml``); :mod:`gdnjit.runner` does the rest.
Semantics (docs/design.md section 10; reference :func:`gdnjit.reference.conv.conv_reference`).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import validate as _v
from .config import get_config
from .runner import RUNNER, KernelCall, supports_pdl
from .spec import get_spec

SPEC = "causal_conv1d_update"
PAD_SLOT_ID = -1
_FLOATS = tuple(_v.FLOAT_NAMES)


def prepare(x, conv_state, weight, bias, activation, conv_state_indices, num_accepted_tokens, query_start_loc,
             max_query_len, pad_slot_id, out, require_cuda: bool = True):
    """All argument checks; returns (out, the named call or None when there is nothing to launch)."""
    (_v.cuda_tensor if require_cuda else _v.tensor)("x", x)
    device = x.device
    for name, t, nd in (("x", x, None), ("conv_state", conv_state, 3), ("weight", weight, 2)):
        _v.tensor(name, t, nd)
        _v.dtype_in(name, t, _FLOATS)
        _v.same_device(name, t, device)
    slots, D, state_len = conv_state.shape
    W = weight.shape[1]
    _v.shape_is("weight", weight, (D, W), "[D, W]")
    if not 2 <= W <= 6:
        raise ValueError(f"weight: expected a kernel width W (weight.shape[1]) of 2..6, got {W}")
    if bias is not None:
        _v.tensor("bias", bias, 1)
        _v.dtype_in("bias", bias, (weight.dtype,))
        _v.same_device("bias", bias, device)
        _v.shape_is("bias", bias, (D,), "[D]")
    silu = silu_flag(activation)
    if pad_slot_id is not None and (isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int)):
        raise TypeError(f"pad_slot_id: expected an int or None, got {type(pad_slot_id).__name__}")
    if pad_slot_id is not None and not -2 ** 63 <= pad_slot_id < 2 ** 63:
        raise ValueError(f"pad_slot_id: expected an int64 (the kernel compares it with the slot indices), got "
                         f"{pad_slot_id}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x: expected [B, D] or [B, D, T] ([tokens, D] with query_start_loc), got shape "
                         f"{tuple(x.shape)}")
    varlen = query_start_loc is not None
    if varlen:
        if conv_state_indices is None:
            raise ValueError("conv_state_indices: required with query_start_loc (it gives the number of requests)")
        _v.tensor("conv_state_indices", conv_state_indices, 1)
        if isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or max_query_len < 1:
            raise ValueError(f"max_query_len: expected an int >= 1 with query_start_loc, got {max_query_len!r}")
        B, T = conv_state_indices.shape[0], max_query_len
        _v.shape_is("x", x, (x.shape[0] if x.dim() == 2 else -1, D), "[tokens, D]")
    elif x.dim() == 2:
        B, T = x.shape[0], 1
        _v.shape_is("x", x, (B, D), "[B, D]")
    else:
        B, T = x.shape[0], (x.shape[2] if x.dim() == 3 else -1)
        _v.shape_is("x", x, (B, D, T), "[B, D, T]")
    spec = get_spec(SPEC)
    if not spec.accepts("T", T):
        raise ValueError(f"x: expected 1..64 tokens per request (x.shape[2] / max_query_len), got {T}")
    idx_dtype = _v.index_tensor("conv_state_indices", conv_state_indices, B, device, contiguous=False)
    acc_dtype = _v.index_tensor("num_accepted_tokens", num_accepted_tokens, B, device)
    qsl_dtype = _v.index_tensor("query_start_loc", query_start_loc, B + 1, device, "[B + 1]")
    cols = W - 2 + T if num_accepted_tokens is not None else W - 1
    if state_len < cols:
        raise ValueError(f"conv_state: expected at least {cols} columns (W - 1{'' if cols == W - 1 else ' + T - 1'}), "
                         f"got shape {tuple(conv_state.shape)}")
    if conv_state_indices is None and slots < B:
        raise ValueError(f"conv_state: expected a slot per request ({B}) without conv_state_indices, got {slots}")
    if out is None:
        out = torch.empty_like(x)
    elif out is not x:
        _v.tensor("out", out)
        _v.dtype_in("out", out, (x.dtype,))
        _v.same_device("out", out, device)
        _v.shape_is("out", out, tuple(x.shape), "x's shape")
        _v.no_overlap("out", out)
    if B == 0 or x.numel() == 0:
        return out, None
    if get_config().check_indices:
        _host_checks(conv_state_indices, num_accepted_tokens, query_start_loc, slots, T, state_len, W)
    # strides (request, token, channel) of x and out: varlen [tokens, D], [B, D] or [B, D, T]
    (x_sn, x_st, x_sd), (o_sn, o_st, o_sd) = (
        (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(2) if t.dim() == 3 else 0, t.stride(1))
        for t in (x, out))
    contig = D % 8 == 0 and all(_v.vector_ok(t, 1) for t in (x, out, conv_state))
    params = dict(x_dtype=_v.FLOAT_NAMES[x.dtype], state_dtype=_v.FLOAT_NAMES[conv_state.dtype],
                  w_dtype=_v.FLOAT_NAMES[weight.dtype], W=W, T=T, idx_dtype=idx_dtype, acc_dtype=acc_dtype,
                  qsl_dtype=qsl_dtype, bias=bias is not None, silu=silu, contig=contig)
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    args = dict(x=x.data_ptr(), w=weight.data_ptr(), bias_ptr=ptr(bias), state=conv_state.data_ptr(),
                idx=ptr(conv_state_indices), num_acc=ptr(num_accepted_tokens), qsl=ptr(query_start_loc),
                out=out.data_ptr(), x_sn=x_sn, x_st=x_st, x_sd=x_sd, o_sn=o_sn, o_st=o_st, o_sd=o_sd,
                s_slot=conv_state.stride(0), s_dim=conv_state.stride(1), s_col=conv_state.stride(2),
                w_sd=weight.stride(0), w_sw=weight.stride(1),
                idx_sn=conv_state_indices.stride(0) if conv_state_indices is not None else 0,
                pool_size=slots, state_len=state_len, pad_slot=-1 if pad_slot_id is None else pad_slot_id, B=B, D=D)
    dev = device.index if device.index is not None else (torch.cuda.current_device() if require_cuda else 0)
    pdl = require_cuda and get_config().pdl and supports_pdl(dev)
    return out, KernelCall(spec, params, dict(B=B, D=D), args, dev, pdl=pdl)


def _host_checks(idx, acc, qsl, slots: int, T: int, state_len: int, W: int) -> None:
    """GDNJIT_CHECK_INDICES: the kernel's traps as IndexErrors on the host (synchronises)."""
    if idx is not None:
        _v.host_index_in_range("conv_state_indices", idx, slots)
    live = idx >= 0 if idx is not None else None
    if acc is not None:
        bad = ((acc < 1) | (acc > state_len - W + 2)) & (live if live is not None else True)
        if bool(bad.any()):
            raise IndexError(f"num_accepted_tokens: expected 1..{state_len - W + 2} for every request, got "
                             f"{acc[bad].tolist()[:4]}")
    if qsl is not None:
        lens = qsl[1:] - qsl[:-1]
        if bool(((lens < 0) | (lens > T)).any()):
            raise IndexError(f"query_start_loc: every request needs 0..max_query_len={T} tokens, got {lens.tolist()[:8]}")


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, activation=None,
                         conv_state_indices: Optional[torch.Tensor] = None,
                         num_accepted_tokens: Optional[torch.Tensor] = None,
                         query_start_loc: Optional[torch.Tensor] = None, max_query_len: int = -1,
                         pad_slot_id: Optional[int] = PAD_SLOT_ID, block_idx_last_scheduled_token=None,
                         initial_state_idx=None, retrieve_parent_token=None, validate_data: bool = False,
                         out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One decode / speculative-verify step of the depthwise causal conv1d; updates ``conv_state`` in place.

    vLLM's signature and semantics (``vllm/model_executor/layers/mamba/ops/causal_conv1d.py``):
    ``x`` ``[B, D]``, ``[B, D, T]`` or varlen ``[tokens, D]`` with ``query_start_loc`` ``[B + 1]`` and
    ``max_query_len`` (T; B from ``conv_state_indices``); bf16 / fp16 / fp32, any strides.
    ``conv_state`` ``[slots, D, state_len]`` (any strides; ``state_len >= W - 1``, ``>= W - 2 + T`` with
    ``num_accepted_tokens``); ``weight`` ``[D, W]``, W 2..6; ``bias`` ``[D]`` (weight's dtype) or None;
    ``activation`` None / False, or True / ``'silu'`` / ``'swish'``; ``conv_state_indices`` ``[B]``
    int32 / int64 (request n -> slot; a negative index or ``pad_slot_id`` marks padding: its output
    rows are zeros and no slot is touched); ``num_accepted_tokens`` ``[B]``: speculative decoding, the
    window starts at column ``num_accepted - 1`` and the state keeps sliding by one token.
    Returns ``out`` (new, or the given ``out``; ``out=x`` works in place) with x's shape and dtype.
    ``block_idx_last_scheduled_token``, ``initial_state_idx`` (prefix caching) and ``retrieve_parent_token``
    (tree verification) are not provided: NotImplementedError. ``validate_data`` is accepted; every call
    is validated. Out-of-range indices stop the kernel (``GDNJIT_CHECK_INDICES=1``: an IndexError).
    """
    unsupported(block_idx_last_scheduled_token, initial_state_idx, retrieve_parent_token)
    out, call = prepare(x, conv_state, weight, bias, activation, conv_state_indices, num_accepted_tokens,
                         query_start_loc, max_query_len, pad_slot_id, out)
    if call is not None:
        RUNNER.launch(call)
    return out


def silu_flag(activation) -> bool:
    """vLLM's ``activation``: None / False (none), True / 'silu' / 'swish' (silu); ValueError otherwise."""
    if activation not in (None, False, True, "silu", "swish"):
        raise ValueError(f"activation: expected None, a bool, 'silu' or 'swish', got {activation!r}")
    return activation not in (None, False)


def unsupported(block_idx_last_scheduled_token, initial_state_idx, retrieve_parent_token) -> None:
    """NotImplementedError for vLLM's prefix-caching and tree-verification arguments (gdnjit has neither)."""
    for name, v in (("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                    ("initial_state_idx", initial_state_idx), ("retrieve_parent_token", retrieve_parent_token)):
        if v is not None:
            raise NotImplementedError(f"causal_conv1d_update: {name} is not supported by gdnjit (pass None)")


def example_call(params: dict, facts: dict, device):
    """Random inputs for one problem of the spec (``gdnjit tune``): the named call and its tensors."""
    dt = {v: k for k, v in _v.FLOAT_NAMES.items()}
    B, D, T, W = facts["B"], facts["D"], params["T"], params["W"]
    ix = {n: getattr(torch, params[n], None) for n in ("idx_dtype", "acc_dtype", "qsl_dtype")}
    cols = W - 2 + T if ix["acc_dtype"] else W - 1
    # channels contiguous ([slots, cols, D] viewed as [slots, D, cols], as vLLM's cache) or strided
    state = (torch.randn(2 * B, cols, D, device=device).transpose(1, 2) if params["contig"]
             else torch.randn(2 * B, D, cols + 1, device=device)[..., :cols]).to(dt[params["state_dtype"]])
    x = torch.randn(B * T, D, device=device) if ix["qsl_dtype"] else torch.randn(B, T, D, device=device).transpose(1, 2)
    x = x.to(dt[params["x_dtype"]])
    weight = torch.randn(D, W, device=device).to(dt[params["w_dtype"]])
    bias = torch.randn(D, device=device).to(weight.dtype) if params["bias"] else None
    idx = torch.randperm(2 * B, device=device)[:B].to(ix["idx_dtype"]) if ix["idx_dtype"] else None
    acc = torch.randint(1, T + 1, (B,), device=device, dtype=ix["acc_dtype"]) if ix["acc_dtype"] else None
    qsl = torch.arange(0, B * T + 1, T, device=device, dtype=ix["qsl_dtype"]) if ix["qsl_dtype"] else None
    if x.dim() == 3 and T == 1:
        x = x[:, :, 0]
    out, call = prepare(x, state, weight, bias, params["silu"], idx, acc, qsl, T, PAD_SLOT_ID, None)
    if dict(call.params) != dict(params):
        raise ValueError(f"causal_conv1d_update example: the inputs give params {call.params}, not {params}")
    return call, (x, state, weight, bias, idx, acc, qsl, out)
