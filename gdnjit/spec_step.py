"""gdnjit's fused speculative step: one launch per layer per step, one state read and one state write whatever T is.

A speculative step of one GDN layer, per request n with checkpoint slot ``state_indices[n]``:

1. replay the first ``num_accepted[n]`` draft tokens the *previous* step verified (their raw k, v, log decay and
   beta were cached at the slot) into the checkpoint, and write it back: the only state write;
2. verify this step's T draft tokens from that state (outputs for all T, no state write), caching their raw k, v,
   log decay and beta at the slot for the next step.

So the pool always holds the state after the accepted tokens of all steps but the last one, and the tokens of the
last step wait in the cache until the next step (or :func:`gated_delta_rule_spec_flush`) replays the accepted ones.
Compared with verify + copy-back (T states written) or FlashInfer's ReplaySSM (verify, then a commit launch that
reads and writes the state again), a step moves the state through memory once each way.

The cache (:class:`SpecCache`, per pool slot, allocated by :func:`spec_cache`) is double-buffered: a step replays
from one half of a slot and caches into the other, because every CTA of a request reads the k / g / beta it replays
(a CTA handles one value head's tile) while others would be overwriting them. ``ctl[slot, 0] & 1`` says which half
holds the previous step's tokens; the kernel flips it (the last CTA of the request to start does, after every CTA
has read it), so callers never track parity, and requests may join, leave or reorder between steps freely: the
cache lives with the slot, not with the batch row. Allocate ``ctl`` zeroed (:func:`spec_cache` does) and give a new
request ``num_accepted = 0`` on its first step.

Why per slot, not per batch row: an engine's batch changes every step (requests finish, join, are preempted); a
per-row cache would have to be gathered to the new row order each step, a per-slot cache moves with the state it
belongs to and costs ~8% of the state's memory (H=16, HV=64, K=V=128, T=8, fp32 state).

Kernel: the ``gdn`` spec with ``fused_step`` set, in its recurrent form or (bf16 q/k, K = 128, T 2..8, by the rules)
its tc form (docs/design.md 4.10). This module validates and
builds the named call; :mod:`gdnjit.runner` dispatches, compiles, binds and launches it. Graph capturable (no host
reads of device values); values a kernel cannot check without a device read (a slot past the pool, an accepted count
outside 0..T) stop it with a trap. Math: :mod:`gdnjit.reference.spec_step`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import validate as _v
from .call_mode import CallMode
from .errors import DtypeError
from .gdn_core import (IN_DTYPES, MAX_T, OUT_DTYPES, SPEC, STATE_DTYPES, SUPPORTED_DIMS, cache_layer, check_cache_sizes,
                       check_tokens, launch_device, uses_pdl)
from .gdn_core import signature as _sig
from .runner import RUNNER, launch_on, remember

# The step and the flush: the pointers each passes per call, by name (rk, rv, rg, rb, ctl: the SpecCache's k, v,
# g, beta, ctl; acc: num_accepted).
STEP = CallMode(SPEC, "fused step", ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "read_idx", "out", "acc",
                                     "rk", "rv", "rg", "rb", "ctl"))
FLUSH = CallMode(SPEC, "fused flush", ("state", "read_idx", "acc", "rk", "rv", "rg", "rb", "ctl"))
_memo: dict = RUNNER.memo()  # metadata signature -> (BoundLaunch, output shape, device)
_MEMO_MAX = 1024


class SpecCache(NamedTuple):
    """The per-slot, double-buffered draft-token cache of one layer (see the module docstring).

    ``k [slots, 2, H, T, K]`` and ``v [slots, 2, HV, T, V]`` in q's dtype (raw, before the l2norm); ``g`` (log decay)
    and ``beta`` (after the sigmoid) ``[slots, 2, HV, T]`` fp32; ``ctl [slots, 2]`` int32 (zeroed at allocation:
    the current half and an arrival count the kernel resets). All contiguous. A leading layer dim is allowed for
    storage (:func:`spec_cache` with ``layers``); pass one layer's cache (``cache.layer(i)``) per call.
    """

    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    ctl: torch.Tensor

    def layer(self, i: int) -> "SpecCache":
        """Layer ``i`` of a cache allocated with a leading layer dim (views, no copy)."""
        return cache_layer(self, i, "ctl")


def spec_cache(slots: int, H: int, HV: int, T: int, K: int, V: int, *, dtype: torch.dtype = torch.bfloat16,
               device=None, layers: Optional[int] = None) -> SpecCache:
    """Allocate a :class:`SpecCache` for a pool of ``slots`` (``layers``: one per layer, leading dim), ``T`` draft
    tokens per step, q/k/v of ``dtype``; ``ctl`` zeroed, the rest uninitialised (never read before written)."""
    check_cache_sizes(layers, H, HV, slots=slots, T=T, K=K, V=V)
    if not 1 <= T <= MAX_T:
        raise ValueError(f"T: expected 1..{MAX_T}, got {T}")
    if dtype not in IN_DTYPES:
        raise DtypeError(f"dtype: expected torch.bfloat16 or torch.float16, got {dtype}")
    lead = (slots, 2) if layers is None else (layers, slots, 2)
    return SpecCache(torch.empty((*lead, H, T, K), dtype=dtype, device=device),
                     torch.empty((*lead, HV, T, V), dtype=dtype, device=device),
                     torch.empty((*lead, HV, T), dtype=torch.float32, device=device),
                     torch.empty((*lead, HV, T), dtype=torch.float32, device=device),
                     torch.zeros((*lead[:-1], 2), dtype=torch.int32, device=device))


def gated_delta_rule_spec_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    cache: SpecCache,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    null_block_id: int = -1,
    output: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One fused speculative step of one layer (module docstring); returns the outputs ``[B, T, HV, V]``.

    Args:
        q, k: ``[B, T, H, K]`` bf16 / fp16 (the T draft tokens; last dim contiguous, other strides free, e.g. views
            of a packed qkv); v: ``[B, T, HV, V]``; a, b: ``[B, T, HV]`` (raw gates; g = -exp(A_log) *
            softplus(a + dt_bias), beta = sigmoid(b)); A_log fp32 ``[HV]``; dt_bias ``[HV]`` fp32 / bf16 / fp16.
        state: the checkpoint pool ``[slots, HV, V, K]`` fp32 / bf16 (K-last; slot pitch ``stride(0)``, each slot's
            block dense), updated in place.
        state_indices: ``[B]`` int32 / int64: row n's slot; ``<= null_block_id`` is padding (nothing read or written;
            output rows 0 in an allocated output, left as they were in a given one).
        num_accepted: ``[B]`` int32 in 0..T: how many of the tokens the previous step verified for this slot to
            replay (0 for a request's first step, or to replay nothing).
        cache: this layer's :class:`SpecCache` (or a tuple of its five tensors in that order; slots =
            ``state.shape[0]``, the same T and head dims, q's dtype).
        scale: q scale (default ``K ** -0.5``); use_qk_l2norm: l2-normalise q and k (eps 1e-6 under the root).
        softplus_beta, softplus_threshold: the softplus of the decay gate (vLLM's defaults 1.0, 20.0).
        null_block_id: an int >= -1: slots <= it are padding (-1: negative slots; vLLM's null block: 0).
        output: optional ``[B, T, HV, V]`` bf16 / fp16 / fp32, last dim contiguous; else allocated in q's dtype.

    With a bf16 state the checkpoint is rounded once per step (after the replayed tokens) and the new tokens start
    from the rounded value; plain decoding rounds after every token, so the two differ by those roundings.
    """
    config = RUNNER.sync()
    tensors = (q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, output)
    try:
        ctensors = tuple(cache)
        sig = (tuple(_sig(x) for x in tensors + ctensors), scale, type(scale), use_qk_l2norm, type(use_qk_l2norm),
               softplus_beta, softplus_threshold, null_block_id, type(null_block_id),
               (q.data_ptr() | k.data_ptr() | v.data_ptr() | state.data_ptr() | cache[0].data_ptr()) & 15)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError, ValueError):  # a non-tensor argument: the checks report it
        sig = hit = None
    if hit is None:
        output, call = prepare(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache, scale,
                               use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id, output)
        if call is None:
            return output
        bound, dev = RUNNER.bind(call), call.device
        remember(_memo, sig, (bound, tuple(output.shape), dev), config, _MEMO_MAX)
    else:
        bound, out_shape, dev = hit
        if output is None:
            output = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    launch_on(dev, bound, STEP.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), A_log.data_ptr(), a.data_ptr(),
                                    dt_bias.data_ptr(), b.data_ptr(), state.data_ptr(), state_indices.data_ptr(),
                                    output.data_ptr(), num_accepted.data_ptr(), *(x.data_ptr() for x in cache)))
    return output


def gated_delta_rule_spec_flush(state: torch.Tensor, state_indices: torch.Tensor, num_accepted: torch.Tensor,
                                cache: SpecCache, *, use_qk_l2norm: bool = True, null_block_id: int = -1) -> None:
    """Replay the accepted tokens of the last step into the checkpoints, without new tokens (a request that
    finishes, or whose state must be current, e.g. to be saved as a prefix): step 1 of
    :func:`gated_delta_rule_spec_step` alone. The cache half is not flipped: the next step of these requests passes
    ``num_accepted = 0``. Arguments as there (the cache's T is the one of the last step)."""
    config = RUNNER.sync()
    try:
        sig = ("flush", tuple(_sig(x) for x in (state, state_indices, num_accepted) + tuple(cache)), use_qk_l2norm,
               type(use_qk_l2norm), null_block_id, type(null_block_id), (state.data_ptr() | cache[0].data_ptr()) & 15)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError, ValueError):
        sig = hit = None
    if hit is None:
        _, call = prepare(None, None, None, None, None, None, None, state, state_indices, num_accepted, cache, None,
                          use_qk_l2norm, 1.0, 20.0, null_block_id, None, flush=True)
        if call is None:
            return
        bound, dev = RUNNER.bind(call), call.device
        remember(_memo, sig, (bound, None, dev), config, _MEMO_MAX)
    else:
        bound, _, dev = hit
    launch_on(dev, bound, FLUSH.pack(state.data_ptr(), state_indices.data_ptr(), num_accepted.data_ptr(),
                                     *(x.data_ptr() for x in cache)))


def _check_cache(cache, slots: int, H: int, HV: int, T: Optional[int], K: int, V: int, in_dtype, device) -> int:
    """Every check of a per-layer cache; returns its T."""
    if not isinstance(cache, tuple) or len(cache) != 5:
        raise TypeError(f"cache: expected a SpecCache (k, v, g, beta, ctl), got {type(cache).__name__}")
    ck = cache[0]
    _v.tensor("cache.k", ck, 5)
    Tc = ck.shape[3]
    if T is not None and Tc != T:
        raise ValueError(f"cache.k: expected T={T} tokens (dim 3, q's tokens per request), got shape {tuple(ck.shape)}")
    if not 1 <= Tc <= MAX_T:
        raise ValueError(f"cache.k: the cached tokens T (dim 3) must be in 1..{MAX_T}, got {Tc}")
    dtypes = (in_dtype,) if in_dtype is not None else IN_DTYPES
    _v.dense_buffer("cache.k", ck, (slots, 2, H, Tc, K), dtypes, device, "[slots, 2, H, T, K]")
    _v.dense_buffer("cache.v", cache[1], (slots, 2, HV, Tc, V), (ck.dtype,), device, "[slots, 2, HV, T, V]")
    _v.dense_buffer("cache.g", cache[2], (slots, 2, HV, Tc), (torch.float32,), device, "[slots, 2, HV, T]",
                     vector=False)
    _v.dense_buffer("cache.beta", cache[3], (slots, 2, HV, Tc), (torch.float32,), device, "[slots, 2, HV, T]",
                     vector=False)
    _v.dense_buffer("cache.ctl", cache[4], (slots, 2), (torch.int32,), device, "[slots, 2]", vector=False)
    return Tc


def _vector(name: str, x, B: int, dtypes, device) -> None:
    _v.tensor(name, x, 1)
    _v.dtype_in(name, x, dtypes)
    _v.same_device(name, x, device)
    _v.shape_is(name, x, (B,), f"[B={B}]")


def prepare(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache, scale, use_qk_l2norm,
            softplus_beta, softplus_threshold, null_block_id, output, *, flush: bool = False,
            require_cuda: bool = True):
    """Every check; ``(output, call)`` with the named :class:`~gdnjit.runner.KernelCall` (None: nothing to run)."""
    (_v.cuda_tensor if require_cuda else _v.tensor)("state", state, 4)
    _v.dtype_in("state", state, STATE_DTYPES)
    device = state.device
    slots, HV, V, K = state.shape
    if K not in SUPPORTED_DIMS or V not in SUPPORTED_DIMS:
        raise ValueError(f"state: K and V (dims 3, 2) must be in {SUPPORTED_DIMS}, got shape {tuple(state.shape)}")
    if state.stride()[1:] != (V * K, K, 1):
        raise ValueError(f"state: each slot's [HV, V, K] block must be dense (strides {(V * K, K, 1)} after the slot "
                         f"dim), got strides {state.stride()}")
    _v.aligned("state", state, 16)
    if state.shape[0] > 1 and state.stride(0) % 4:
        raise ValueError(f"state: the slot pitch must be a multiple of 4 elements (16-byte loads), got {state.stride(0)}")
    use_qk_l2norm = _v.boolean("use_qk_l2norm", use_qk_l2norm)
    _v.null_block("null_block_id", null_block_id)
    _v.tensor("state_indices", state_indices, 1)
    B = state_indices.shape[0]
    _vector("state_indices", state_indices, B, _v.INDEX_NAMES, device)
    _vector("num_accepted", num_accepted, B, (torch.int32,), device)
    if B > 1 and num_accepted.stride(0) != 1:
        raise ValueError(f"num_accepted: expected a contiguous tensor, got stride {num_accepted.stride()}")

    if flush:
        if not isinstance(cache, tuple) or len(cache) != 5:
            raise TypeError(f"cache: expected a SpecCache (k, v, g, beta, ctl), got {type(cache).__name__}")
        _v.tensor("cache.k", cache[0], 5)
        H = cache[0].shape[2]
        if H < 1 or HV % H:
            raise ValueError(f"cache.k: its heads H (dim 2) must divide HV={HV}, got shape {tuple(cache[0].shape)}")
        T = _check_cache(cache, slots, H, HV, None, K, V, None, device)
        in_dtype, out_dtype, dtb_dtype = cache[0].dtype, cache[0].dtype, torch.float32
        strides = {}  # no token inputs: their strides keep the spec's defaults (0)
        scale, zero_padding = 1.0, False
    else:
        T, H = check_tokens(q, k, v, a, b, B, HV, K, V, device, "draft tokens")
        _v.value_heads(q, k, v, SUPPORTED_DIMS)
        _v.gate_params(A_log, dt_bias, HV, device)
        scale = K ** -0.5 if scale is None else _v.real_number("scale", scale)
        if scale <= 0:
            raise ValueError(f"scale: expected a positive float, got {scale!r}")
        softplus_beta = _v.real_number("softplus_beta", softplus_beta)
        softplus_threshold = _v.real_number("softplus_threshold", softplus_threshold)
        if softplus_beta <= 0:
            raise ValueError(f"softplus_beta: expected a positive float, got {softplus_beta!r}")
        _check_cache(cache, slots, H, HV, T, K, V, q.dtype, device)
        zero_padding = output is None  # a caller's output rows of padding requests are left as they were
        if output is None:
            output = torch.empty((B, T, HV, V), dtype=q.dtype, device=device)
        else:
            _v.given_output(output, (B, T, HV, V), "[B, T, HV, V]", OUT_DTYPES, device)
        in_dtype, out_dtype, dtb_dtype = q.dtype, output.dtype, dt_bias.dtype
        strides = {}
        for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b), ("o", output)):
            strides[f"{name}_sn"], strides[f"{name}_st"], strides[f"{name}_sh"] = x.stride()[:3]
    if B == 0:
        return output, None

    params = dict(K=K, V=V, T=T, in_dtype=_v.FLOAT_NAMES[in_dtype], out_dtype=_v.FLOAT_NAMES[out_dtype],
                  state_dtype=_v.FLOAT_NAMES[state.dtype], dtb_dtype=_v.FLOAT_NAMES[dtb_dtype], pool=True,
                  idx_dtype=_v.INDEX_NAMES[state_indices.dtype], update=False, l2norm=use_qk_l2norm,
                  gates="given" if flush else "raw",  # a flush has no gate inputs (its g / beta are the cached ones)
                  fused_step="flush" if flush else "step")  # padding: the null block is min_slot, an argument
    args = dict(
        state=state.data_ptr(), read_idx=state_indices.data_ptr(), acc=num_accepted.data_ptr(),
        rk=cache[0].data_ptr(), rv=cache[1].data_ptr(), rg=cache[2].data_ptr(), rb=cache[3].data_ptr(),
        ctl=cache[4].data_ptr(), slot_stride=state.stride(0), pool_size=slots, **strides, B=B, H=H, HV=HV,
        scale=scale, softplus_beta=float(softplus_beta), softplus_threshold=float(softplus_threshold),
        zero_padding=int(zero_padding), s_head=V * K, s_row=K, read_sn=state_indices.stride(0),
        min_slot=null_block_id + 1,
    )
    if not flush:
        args.update(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), A_log=A_log.data_ptr(), a=a.data_ptr(),
                    dt_bias=dt_bias.data_ptr(), b=b.data_ptr(), out=output.data_ptr(), gate_sh=A_log.stride(0),
                    dtb_sh=dt_bias.stride(0))
    dev = launch_device(device, require_cuda)
    return output, (FLUSH if flush else STEP).call(params, dict(B=B, H=H, HV=HV), args, dev,
                                                   pdl=uses_pdl(dev) if require_cuda else False)
