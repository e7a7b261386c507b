"""The GDN step under serving engines' calling conventions (vLLM's and SGLang's kernels), for :mod:`gdnjit.compat`.

The same ``gdn`` spec and kernels as :mod:`gdnjit.gdn`, with the engine-convention params set
(``specs/gdn.yaml``: ``varlen``, ``accepted``, ``tree``, ``inter_indexed``, ``null_slot``, ``padding``):

- varlen tokens: q/k/v/a/b hold one flat token dim (``[1, total, ...]``) and request n's tokens are rows
  ``cu_seqlens[n] .. cu_seqlens[n + 1] - 1`` (0-length requests allowed: nothing read or written);
- a 2-D read slot map with an accepted count: request n starts from slot
  ``read_idx[n, num_accepted[n] - 1]`` (vLLM's speculative decoding);
- per-token slot writes ``ssm_idx[n, t]`` (the state after token t), as in :mod:`gdnjit.gdn`;
- an intermediate buffer ``[rows, steps, HV, V, K]`` whose row is ``inter_idx[n]`` (negative: not cached), or,
  varlen without ``inter_idx``, the request's first token row (vLLM's ``inplace_final_state=False``);
- trees: token t >= 1 starts from its parent's state as cached in the buffer (SGLang's EAGLE verify);
- padding: ``null_slot`` "negative" (slots < 0 are padding) or "nonpositive" (vLLM: slot 0 is the null block);
  ``padding`` "skip" (nothing computed or written; outputs zeros) or "zero_state" (SGLang: computed from a
  zero state, outputs and buffer rows written, no pool write).

This module validates and builds the named :class:`~gdnjit.runner.KernelCall`; :mod:`gdnjit.runner` dispatches,
compiles, binds and launches it. Every check reads tensor metadata only (no device read), so a call is graph
capturable; values a kernel cannot trust (slots past the pool, a count outside 1..S, lengths past T where
buffers have T columns, a parent not before its child) stop it with a trap instead of corrupting memory.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import validate as _v
from .call_mode import CallMode
from .errors import DtypeError
from .gdn_core import IN_DTYPES, MAX_T, OUT_DTYPES, SPEC, STATE_DTYPES, SUPPORTED_DIMS, launch_device, uses_pdl
from .gdn_core import ptr as _ptr
from .gdn_core import signature as _sig
from .runner import RUNNER, launch_on, remember

__all__ = ["engine_step", "prepare", "ENGINE"]

# The engines' step: the pointers it passes per call, by name (the ReplaySSM caches: rk / rv the raw k / v).
ENGINE = CallMode(SPEC, "engine", ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "read_idx", "out", "inter",
                                   "ssm_idx", "cu", "acc", "parent", "inter_idx", "rk", "rv", "rg", "rb"))
_memo: dict = RUNNER.memo()  # metadata signature -> (BoundLaunch, output shape, device)
_MEMO_MAX = 1024
_NULL_SLOTS = ("negative", "nonpositive")
_PADDINGS = ("skip", "zero_state")


def engine_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, A_log: torch.Tensor, a: torch.Tensor,
                dt_bias: torch.Tensor, b: torch.Tensor, state: torch.Tensor, *, T: int,
                read_idx: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                num_accepted: Optional[torch.Tensor] = None, ssm_idx: Optional[torch.Tensor] = None,
                inter: Optional[torch.Tensor] = None, inter_idx: Optional[torch.Tensor] = None,
                parent: Optional[torch.Tensor] = None, bounded: bool = False, update: bool = True,
                null_slot: str = "negative",
                padding: str = "skip", gates: str = "raw", scale: Optional[float] = None, l2norm: bool = True,
                softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
                output: Optional[torch.Tensor] = None, replay_cache: Optional[tuple] = None,
                zero_padding: bool = True, round_beta: bool = False) -> torch.Tensor:
    """One GDN step over a state pool under an engine's conventions (module docstring); returns the output
    ``[*q.shape[:2], HV, V]`` (``output`` if given, else a new tensor of q's dtype).

    Shapes: q, k ``[N, T, H, K]`` (``cu_seqlens`` given: ``[1, total, H, K]``); v ``[.., HV, V]``; a, b
    ``[.., HV]`` with the same leading dims; A_log fp32 ``[HV]``, dt_bias ``[HV]``; state ``[slots, HV, V, K]``
    (slot pitch ``stride(0)``, each slot's block dense). ``T``: the most tokens a request has (without
    ``cu_seqlens`` it is ``q.shape[1]``; with it, a bound when ``bounded`` or when ``ssm_idx`` / ``parent`` / an
    indexed buffer is given (a longer request stops the kernel with a trap), else only what the dispatch expects).
    read_idx ``[N]`` (any stride) or, with ``num_accepted`` (int32 ``[N]``), ``[N, S]`` (unit column stride);
    ssm_idx ``[N, T]``; inter ``[rows, steps, HV, V, K]`` (inner four dims dense); inter_idx ``[N]`` of
    read_idx's dtype; parent int32 ``[N, >= T]`` (unit column stride; needs ``inter``); cu_seqlens int32 ``[N + 1]``.
    ``replay_cache``: the ReplaySSM caches ``(rawv [slots, HV, L, V], rawk [slots, H, L, K], g [slots, HV, L],
    beta [slots, HV, L])`` (v / k bf16, g / beta fp32, contiguous, L >= T: FlashInfer's L == T, SGLang's rings
    longer): token t of a request (t counted inside it, also with ``cu_seqlens``; t >= L is not stored, as SGLang)
    has its raw k, v, log decay and beta stored at position t of its read slot (padding rows store nothing). ``zero_padding``: padding rows
    get zero outputs (False: their rows of a given ``output`` are left as they were). ``round_beta``: raw gates'
    beta = sigmoid(b) rounded to q's dtype before use (SGLang's packed decode; T = 1 only); False: fp32.
    """
    config = RUNNER.sync()
    rawv, rawk, g_cache, beta_cache = (replay_cache if isinstance(replay_cache, tuple) and len(replay_cache) == 4
                                       else (None,) * 4)
    tensors = (q, k, v, A_log, a, dt_bias, b, state, read_idx, cu_seqlens, num_accepted, ssm_idx, inter, inter_idx,
               parent, output, rawv, rawk, g_cache, beta_cache)
    try:
        sig = (tuple(_sig(x) for x in tensors), T, bounded, type(bounded), update, type(update), null_slot, padding,
               gates, scale, type(scale), zero_padding, type(zero_padding), replay_cache is None,
               l2norm, type(l2norm), softplus_beta, softplus_threshold, round_beta, type(round_beta),
               (q.data_ptr() | k.data_ptr() | state.data_ptr() | _ptr(inter)) & 15)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError):  # a non-tensor argument: the checks below report it
        sig = hit = None
    if hit is None:
        output, call = prepare(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx,
                               inter, inter_idx, parent, bounded, update, null_slot, padding, gates, scale, l2norm,
                               softplus_beta, softplus_threshold, output, replay_cache=replay_cache,
                               zero_padding=zero_padding, round_beta=round_beta)
        if call is None:
            return output
        bound, dev = RUNNER.bind(call), call.device
        remember(_memo, sig, (bound, tuple(output.shape), dev), config, _MEMO_MAX)
    else:
        bound, out_shape, dev = hit
        if output is None:
            output = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    launch_on(dev, bound, ENGINE.pack(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), _ptr(A_log), a.data_ptr(), _ptr(dt_bias), b.data_ptr(),
        state.data_ptr(), read_idx.data_ptr(), output.data_ptr(), _ptr(inter), _ptr(ssm_idx), _ptr(cu_seqlens),
        _ptr(num_accepted), _ptr(parent), _ptr(inter_idx), _ptr(rawk), _ptr(rawv), _ptr(g_cache), _ptr(beta_cache)))
    return output


def _replay_caches(caches, slots: int, H: int, HV: int, T: int, K: int, V: int, device):
    """The ReplaySSM verify caches for a pool of ``slots``: (rawv, rawk, g, beta), checked (raw k and v in bf16
    whatever q's dtype, as FlashInfer: fp16 inputs are rounded to bf16 there). Their token dim L (dim 2) holds
    tokens 0 .. L - 1 of each (slot, head): L >= T (FlashInfer's caches: L == T, checked by its entry point;
    SGLang's rings are longer)."""
    if not isinstance(caches, (tuple, list)) or len(caches) != 4:
        raise TypeError("replay_cache: expected (replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta)")
    _v.tensor("replayssm_rawv", caches[0], 4)
    L = caches[0].shape[2]
    if L < T:
        raise ValueError(f"replayssm_rawv: expected >= T={T} tokens per slot and head (dim 2), got shape "
                         f"{tuple(caches[0].shape)}")
    return [_v.dense_buffer(name, x, shape, dtypes, device, "[slots, heads, L >= T, dim]" if len(shape) == 4 else
                            "[slots, HV, L >= T]", vector=len(shape) == 4)  # g / beta are read one by one
            for name, x, shape, dtypes in (("replayssm_rawv", caches[0], (slots, HV, L, V), (torch.bfloat16,)),
                                           ("replayssm_rawk", caches[1], (slots, H, L, K), (torch.bfloat16,)),
                                           ("replayssm_g", caches[2], (slots, HV, L), (torch.float32,)),
                                           ("replayssm_beta", caches[3], (slots, HV, L), (torch.float32,)))]


def _int32_vector(name: str, x: torch.Tensor, n: int, device) -> None:
    _v.tensor(name, x, 1)
    _v.dtype_in(name, x, (torch.int32,))
    _v.same_device(name, x, device)
    _v.shape_is(name, x, (n,), f"[{n}]")
    if n > 1 and x.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous tensor, got stride {x.stride()}")


def prepare(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx, inter, inter_idx,
            parent, bounded, update, null_slot, padding, gates, scale, l2norm, softplus_beta, softplus_threshold, output,
            require_cuda: bool = True, replay_cache=None, zero_padding: bool = True, round_beta: bool = False):
    """Every check; (output, KernelCall or None when there is no request). ``require_cuda=False``: CPU tests."""
    (_v.cuda_tensor if require_cuda else _v.tensor)("q", q, 4)
    _v.dtype_in("q", q, IN_DTYPES)
    device = q.device
    lead = tuple(q.shape[:2])
    H, K = q.shape[2], q.shape[3]
    if K not in SUPPORTED_DIMS:
        raise ValueError(f"q: head dim K must be one of {SUPPORTED_DIMS}, got {K}")
    if H < 1:
        raise ValueError(f"q: number of heads H must be >= 1, got {H}")
    if isinstance(T, bool) or not isinstance(T, int) or not 1 <= T <= MAX_T:
        raise ValueError(f"T: expected an int in 1..{MAX_T} (tokens per request), got {T!r}")
    varlen = cu_seqlens is not None
    if varlen:
        if lead[0] != 1:
            raise ValueError(f"q: with cu_seqlens expected shape [1, total_tokens, H, K], got {tuple(q.shape)}")
        _v.tensor("cu_seqlens", cu_seqlens, 1)
        if cu_seqlens.shape[0] < 1:
            raise ValueError("cu_seqlens: expected shape [N + 1], got an empty tensor")
        N = cu_seqlens.shape[0] - 1
        _int32_vector("cu_seqlens", cu_seqlens, N + 1, device)
    else:
        N = lead[0]
        if lead[1] != T:
            raise ValueError(f"q: expected {T} tokens per request (dim 1), got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        _v.tensor(name, x, 4)
        if x.dtype != q.dtype:
            raise DtypeError(f"{name}: expected the dtype of q ({q.dtype}), got {x.dtype}")
        _v.same_device(name, x, device)
    _v.shape_is("k", k, q.shape, "q.shape")
    if tuple(v.shape[:2]) != lead:
        raise ValueError(f"v: expected shape [{lead[0]}, {lead[1]}, HV, V], got {tuple(v.shape)}")
    HV, V = _v.value_heads(q, k, v, SUPPORTED_DIMS)
    if gates not in ("raw", "given"):
        raise ValueError(f"gates: expected 'raw' or 'given', got {gates!r}")
    given = gates == "given"
    for name, x in (("g" if given else "a", a), ("beta" if given else "b", b)):
        _v.tensor(name, x, 3)
        if given:
            _v.dtype_in(name, x, (torch.float32,))
        elif x.dtype != q.dtype:
            raise DtypeError(f"{name}: expected the dtype of q ({q.dtype}), got {x.dtype}")
        _v.same_device(name, x, device)
        _v.shape_is(name, x, (*lead, HV), f"[{lead[0]}, {lead[1]}, HV]")
    if not given:
        _v.gate_params(A_log, dt_bias, HV, device)
    elif A_log is not None or dt_bias is not None:
        raise ValueError("A_log, dt_bias: not used with given gates (g, beta); pass None")
    scale = K ** -0.5 if scale is None else _v.real_number("scale", scale)
    if scale <= 0:
        raise ValueError(f"scale: expected a positive float, got {scale!r}")
    softplus_beta = _v.real_number("softplus_beta", softplus_beta)
    if softplus_beta <= 0:
        raise ValueError(f"softplus_beta: expected a positive float, got {softplus_beta!r}")
    softplus_threshold = _v.real_number("softplus_threshold", softplus_threshold)
    l2norm = _v.boolean("use_qk_l2norm", l2norm)
    update = _v.boolean("update", update)
    bounded = _v.boolean("bounded", bounded)
    if null_slot not in _NULL_SLOTS:
        raise ValueError(f"null_slot: expected one of {_NULL_SLOTS}, got {null_slot!r}")
    if padding not in _PADDINGS:
        raise ValueError(f"padding: expected one of {_PADDINGS}, got {padding!r}")

    # --- state pool -------------------------------------------------------------------------
    _v.tensor("initial_state", state, 4)
    _v.dtype_in("initial_state", state, STATE_DTYPES)
    _v.same_device("initial_state", state, device)
    if tuple(state.shape[1:]) != (HV, V, K):
        raise ValueError(f"initial_state: expected shape [slots, HV={HV}, V={V}, K={K}], got {tuple(state.shape)}")
    if state.stride()[1:] != (V * K, K, 1):
        raise ValueError(f"initial_state: each slot's [HV, V, K] block must be dense, got strides {state.stride()}")
    _v.aligned("initial_state", state, 16)
    if state.shape[0] < 1:
        raise ValueError("initial_state: expected at least one slot, got an empty pool")
    if state.shape[0] > 1 and state.stride(0) < HV * V * K:
        raise ValueError(f"initial_state: slots overlap (slot stride {state.stride(0)} < HV*V*K = {HV * V * K})")

    # --- slot maps ---------------------------------------------------------------------------
    _v.tensor("read_idx", read_idx)
    _v.dtype_in("read_idx", read_idx, _v.INDEX_NAMES)
    _v.same_device("read_idx", read_idx, device)
    accepted = num_accepted is not None
    if accepted:
        if read_idx.dim() != 2 or read_idx.shape[0] != N:
            raise ValueError(f"read_idx: with num_accepted expected a 2-D slot map [N={N}, S], got {tuple(read_idx.shape)}")
        if read_idx.shape[1] > 1 and read_idx.stride(1) != 1:
            raise ValueError(f"read_idx: expected unit stride along dim 1, got strides {read_idx.stride()}")
        _int32_vector("num_accepted_tokens", num_accepted, N, device)
        read_cols = read_idx.shape[1]
    else:
        if read_idx.dim() != 1 or read_idx.shape[0] != N:
            raise ValueError(f"read_idx: expected shape [N={N}], got {tuple(read_idx.shape)}")
        read_cols = 1
    if read_cols < 1:
        raise ValueError("read_idx: expected at least one column")
    idx_dtype = _v.INDEX_NAMES[read_idx.dtype]
    ssm_dtype = "none"
    if ssm_idx is not None:
        if not update:
            raise ValueError("ssm_state_indices: writes pool slots, so the state update must be on")
        if inter is not None:
            raise ValueError("ssm_state_indices: cannot be combined with an intermediate buffer")
        _v.tensor("ssm_state_indices", ssm_idx, 2)
        _v.dtype_in("ssm_state_indices", ssm_idx, _v.INDEX_NAMES)
        _v.same_device("ssm_state_indices", ssm_idx, device)
        _v.shape_is("ssm_state_indices", ssm_idx, (N, T), f"[N={N}, T={T}]")
        ssm_dtype = _v.INDEX_NAMES[ssm_idx.dtype]

    # --- intermediate buffer, tree -----------------------------------------------------------
    inter_dtype = "none"
    if inter is not None:
        _v.tensor("intermediate_states_buffer", inter, 5)
        _v.dtype_in("intermediate_states_buffer", inter, STATE_DTYPES)
        _v.same_device("intermediate_states_buffer", inter, device)
        if tuple(inter.shape[2:]) != (HV, V, K) or inter.stride()[1:] != (HV * V * K, V * K, K, 1):
            raise ValueError(f"intermediate_states_buffer: expected [rows, steps, HV={HV}, V={V}, K={K}] with dense "
                             f"steps, got shape {tuple(inter.shape)} strides {inter.stride()}")
        by_token = varlen and inter_idx is None
        if not by_token and inter.shape[1] < T:
            raise ValueError(f"intermediate_states_buffer: expected >= T={T} steps (dim 1), got {inter.shape[1]}")
        if not by_token and inter_idx is None and inter.shape[0] < N:
            raise ValueError(f"intermediate_states_buffer: expected >= N={N} rows, got {inter.shape[0]}")
        if inter.shape[0] > 1 and inter.stride(0) < inter.shape[1] * HV * V * K:
            raise ValueError(f"intermediate_states_buffer: rows overlap (strides {inter.stride()})")
        _v.aligned("intermediate_states_buffer", inter, 16)
        inter_dtype = _v.FLOAT_NAMES[inter.dtype]
    if inter_idx is not None:
        if inter is None:
            raise ValueError("intermediate_state_indices: needs intermediate_states_buffer")
        _v.tensor("intermediate_state_indices", inter_idx, 1)
        if inter_idx.dtype != read_idx.dtype:
            raise DtypeError(f"intermediate_state_indices: expected the dtype of the read indices ({read_idx.dtype}), "
                            f"got {inter_idx.dtype}")
        _v.same_device("intermediate_state_indices", inter_idx, device)
        _v.shape_is("intermediate_state_indices", inter_idx, (N,), f"[N={N}]")
        if N > 1 and inter_idx.stride(0) != 1:
            raise ValueError(f"intermediate_state_indices: expected a contiguous tensor, got stride {inter_idx.stride()}")
    if parent is not None:
        if inter is None:
            raise ValueError("retrieve_parent_token: tree verification needs intermediate_states_buffer")
        _v.tensor("retrieve_parent_token", parent, 2)
        _v.dtype_in("retrieve_parent_token", parent, (torch.int32,))
        _v.same_device("retrieve_parent_token", parent, device)
        if parent.shape[0] != N or parent.shape[1] < T:
            raise ValueError(f"retrieve_parent_token: expected shape [N={N}, >= T={T}], got {tuple(parent.shape)}")
        if parent.shape[1] > 1 and parent.stride(1) != 1:
            raise ValueError(f"retrieve_parent_token: expected unit stride along dim 1, got strides {parent.stride()}")

    rawv = rawk = g_cache = beta_cache = None
    if replay_cache is not None:
        rawv, rawk, g_cache, beta_cache = _replay_caches(replay_cache, state.shape[0], H, HV, T, K, V, device)
    zero_padding = _v.boolean("zero_padding", zero_padding)
    if _v.boolean("round_beta", round_beta) and (gates != "raw" or T != 1):
        raise ValueError(f"round_beta: only for one-token steps with raw gates (SGLang's packed decode), got T={T}, "
                         f"gates={gates!r}")

    # --- output -------------------------------------------------------------------------------
    out_shape = (*lead, HV, V)
    if output is None:
        output = torch.empty(out_shape, dtype=q.dtype, device=device)
    else:
        _v.given_output(output, out_shape, "[.., HV, V]", OUT_DTYPES, device)
    if N == 0 or lead[1] == 0:
        return output, None

    params = dict(K=K, V=V, T=T, in_dtype=_v.FLOAT_NAMES[q.dtype], out_dtype=_v.FLOAT_NAMES[output.dtype],
                  state_dtype=_v.FLOAT_NAMES[state.dtype],
                  dtb_dtype="fp32" if given else _v.FLOAT_NAMES[dt_bias.dtype], pool=True,
                  idx_dtype=idx_dtype, inter_dtype=inter_dtype, ssm_idx_dtype=ssm_dtype, update=update, l2norm=l2norm,
                  varlen=varlen, bounded=varlen and bounded, accepted=accepted, tree=parent is not None,
                  inter_indexed=inter_idx is not None, null_slot=null_slot, padding=padding, gates=gates,
                  replay_cache=replay_cache is not None)
    dev = launch_device(device, require_cuda)

    def strides(x):
        """(row, token, head) element strides; varlen: the row stride is the token stride (the kernel's row of
        request n is its first token, cu_seqlens[n])."""
        st = x.stride()
        return (st[1] if varlen else st[0]), st[1], st[2]

    (q_sn, q_st, q_sh), (k_sn, k_st, k_sh), (v_sn, v_st, v_sh) = strides(q), strides(k), strides(v)
    (a_sn, a_st, a_sh), (b_sn, b_st, b_sh), (o_sn, o_st, o_sh) = strides(a), strides(b), strides(output)
    ssm_sn, ssm_st = (0, 0) if ssm_idx is None else ssm_idx.stride()
    args = dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), A_log=_ptr(A_log), a=a.data_ptr(),
        dt_bias=_ptr(dt_bias), b=b.data_ptr(), state=state.data_ptr(), read_idx=read_idx.data_ptr(),
        out=output.data_ptr(), inter=_ptr(inter), ssm_idx=_ptr(ssm_idx), cu=_ptr(cu_seqlens), acc=_ptr(num_accepted),
        parent=_ptr(parent), inter_idx=_ptr(inter_idx), rk=_ptr(rawk), rv=_ptr(rawv), rg=_ptr(g_cache),
        rb=_ptr(beta_cache),
        slot_stride=state.stride(0), pool_size=state.shape[0], q_sn=q_sn, q_st=q_st, q_sh=q_sh, k_sn=k_sn, k_st=k_st,
        k_sh=k_sh, v_sn=v_sn, v_st=v_st, v_sh=v_sh, a_sn=a_sn, a_st=a_st, a_sh=a_sh, b_sn=b_sn, b_st=b_st, b_sh=b_sh,
        o_sn=o_sn, o_st=o_st, o_sh=o_sh, inter_sn=0 if inter is None else inter.stride(0), ssm_sn=ssm_sn, ssm_st=ssm_st,
        B=N, H=H, HV=HV, scale=scale, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
        zero_padding=int(zero_padding), s_head=V * K, s_row=K, read_sn=read_idx.stride(0), read_cols=read_cols,
        parent_sn=0 if parent is None else parent.stride(0), inter_rows=0 if inter is None else inter.shape[0],
        gate_sh=0 if A_log is None else A_log.stride(0), dtb_sh=0 if dt_bias is None else dt_bias.stride(0),
        beta_round=int(round_beta), rc_len=0 if rawv is None else rawv.shape[2],
    )
    call = ENGINE.call(params, dict(B=N, H=H, HV=HV), args, dev, pdl=uses_pdl(dev) if require_cuda else False)
    return output, call
