"""Lazy-state GDN: plain and speculative decode steps at one read of the state (docs/design.md section 11).

A pool slot holds its checkpoint state S0 (the ``state`` pool) and, in a :class:`LazyCache`, a ring of the last P
tokens' normalised key k^, correction u and cumulative log decay G since S0. A step (:func:`gated_delta_rule_lazy_step`)
reads S0 once, computes the outputs of its T new tokens from S0 and the ring, and appends their rows; the state is
written only when the slot *folds* (S0 <- the state after its P committed rows, ring emptied), which happens in the
same launch when the next T rows would not fit the window W (a spec tunable, 16 by default). So a plain T = 1 decode
moves about 1 + 1/W state passes a token instead of 2, and a speculative step one read plus its share of the folds.
(At small batches an fp32 state's plain steps fold every token instead, W = 0: see Launches below.)

Cursors live with the slot (``cache.cursor [slots, 4]`` int32: committed length, ring base, pending rows, an arrival
count), so requests may join, leave and reorder between steps; the kernel commits them itself (the last CTA of a
slot to finish does).

- Plain decoding: ``num_accepted=None``: the T rows are committed at once.
- Speculative decoding: pass ``num_accepted`` (``[B]`` int32): how many of the slot's *previous* step's T pending
  rows were accepted (0..T; 0 for a request's first step). Accepting is a cursor move; this step's T rows wait as
  pending for the next step's count.

Engine contract: while a slot's ring is not empty its pool entry is not its current state. Call
:func:`gated_delta_rule_lazy_fold` before the state is read as such (a request finishes, is preempted, its state is
saved for prefix caching, a prefill continues from it), and :func:`gated_delta_rule_lazy_reset` when a prefill
wrote a fresh checkpoint into the slot (the ring is emptied; nothing is folded).

Precision: fp32 arithmetic; a bf16 / fp16 state is rounded once per fold, not once per token. Ring rows are stored
in the cache's dtype (:func:`lazy_cache`'s ``dtype``, bf16 unless given): give an fp32 state fp32 rings (bf16 rings
cost it about 1e-3 relative), and a 16-bit state fp32 rings where its drift matters more than the ring's bytes
(with 16-bit rings a folded state rounds twice: the ring rows, then the state).

Each slot may appear once per call (its ring rows and cursor are written once a call); ``GDNJIT_CHECK_INDICES=1``
checks it.

Launches: a plain step (T = 1), an fp32 state's speculative steps of T 2 / 3 at larger batches and a fold run the
spec's rows form, a prep launch (with the step's window: it decides the folds) and then the state launch, sharing a
scratch buffer allocated per call (:func:`scratch_bytes`); the other speculative steps and plain steps at small
batches the tile form, one launch; an fp32 state's plain steps at small batches (B * HV <= 512) the eager form, one
launch: the plain decode's kernel, which folds its token (and any rows an earlier lazy step left) into the checkpoint
at once and leaves the ring empty, because there a step's latency, not its bytes, is its time (docs/design.md section
11; :func:`launches` asks the dispatcher). ``gdnjit tune`` times steps over whole fold cycles (:func:`example_steps`).

All calls are graph capturable (no host reads of device values); a slot past the pool stops the kernel (trap).
This module validates and builds the named calls of the ``gdn_lazy`` spec; :mod:`gdnjit.runner` does the rest.
Reference: :mod:`gdnjit.reference.lazy`. FlashInfer's u-cache calls over the same kernel: :mod:`gdnjit.ucache`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from . import validate as _v
from .call_mode import CallMode
from .errors import DtypeError
from .gdn_core import (OUT_DTYPES, SUPPORTED_DIMS, cache_layer, check_cache_sizes, check_tokens, launch_device,
                       uses_pdl)
from .gdn_core import signature as _sig
from .config import get_config
from .runner import RUNNER, KernelCall, launch_on, remember
from .spec import get_spec

SPEC = get_spec("gdn_lazy")
RING = 32                 # physical ring rows of a LazyCache (window + T <= 32 for every window the spec allows)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
RING_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

STEP = CallMode(SPEC, "lazy step", ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state", "idx", "out", "k_ring",
                                    "u_ring", "g_ring", "cursor", "acc", "scratch"))
FOLD = CallMode(SPEC, "lazy fold", ("state", "idx", "k_ring", "u_ring", "g_ring", "cursor", "acc", "scratch"))
RESET = CallMode(SPEC, "lazy reset", ("idx", "cursor"))
_memo: dict = RUNNER.memo()  # metadata signature -> (BoundLaunches, output shape, device, scratch bytes)
_MEMO_MAX = 1024


class LazyCache(NamedTuple):
    """The per-slot rings and cursors of one layer (module docstring).

    ``k [slots, H, 32, K]`` (normalised keys) and ``u [slots, HV, 32, V]`` (corrections) in the ring dtype, ``g
    [slots, HV, 32]`` fp32 (cumulative log decay since the checkpoint), ``cursor [slots, 4]`` int32 (committed
    length, base row, pending rows, arrival count; zeros: an empty ring). Inner dims dense; the slot dim may be
    strided (k and u: bases and slot pitches 16-byte aligned). A leading layer dim is allowed for storage (:func:`lazy_cache` with ``layers``): pass
    ``cache.layer(i)`` per call.
    """

    k: torch.Tensor
    u: torch.Tensor
    g: torch.Tensor
    cursor: torch.Tensor

    def layer(self, i: int) -> "LazyCache":
        """Layer ``i`` of a cache allocated with a leading layer dim (views, no copy)."""
        return cache_layer(self, i, "cursor")


def lazy_cache(slots: int, H: int, HV: int, K: int, V: int, *, dtype: torch.dtype = torch.bfloat16, device=None,
               layers: Optional[int] = None) -> LazyCache:
    """Allocate an empty :class:`LazyCache` for a pool of ``slots`` with ring rows of ``dtype`` (fp32 / bf16 /
    fp16; bf16 by default: give an fp32 state fp32 rings, see the module docstring) on ``device`` (``layers``: a
    leading layer dim). Everything is zeroed: every slot starts with an empty ring."""
    check_cache_sizes(layers, H, HV, slots=slots, K=K, V=V)
    for name, x in (("K", K), ("V", V)):
        if x not in SUPPORTED_DIMS:
            raise ValueError(f"{name}: expected one of {SUPPORTED_DIMS}, got {x}")
    if dtype not in RING_DTYPES:
        raise DtypeError(f"dtype: expected torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    lead = (slots,) if layers is None else (layers, slots)
    return LazyCache(torch.zeros((*lead, H, RING, K), dtype=dtype, device=device),
                     torch.zeros((*lead, HV, RING, V), dtype=dtype, device=device),
                     torch.zeros((*lead, HV, RING), dtype=torch.float32, device=device),
                     torch.zeros((*lead, 4), dtype=torch.int32, device=device))


def gated_delta_rule_lazy_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cache: LazyCache,
    *,
    num_accepted: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    null_block_id: int = -1,
    output: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One lazy decode step of one layer (module docstring); returns the outputs ``[B, T, HV, V]``.

    Args:
        q, k: ``[B, T, H, K]`` bf16 / fp16, T in 1..16 (last dim contiguous, other strides free); v: ``[B, T, HV,
            V]``; a, b: ``[B, T, HV]`` (raw gates: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); heads
            contiguous); A_log, dt_bias: ``[HV]`` fp32 / bf16 / fp16 (contiguous).
        state: the checkpoint pool ``[slots, HV, V, K]`` fp32 / bf16 / fp16 (K contiguous; slot, head and row
            strides free, 16-byte aligned), written only where a slot folds (an fp32 state's plain steps at small
            batches fold every step: the eager form, module docstring).
        state_indices: ``[B]`` int32 / int64, row n's slot; ``<= null_block_id`` (or negative) is padding: nothing
            read or written, its output rows zeros in an allocated output (left as they were in a given one).
        cache: this layer's :class:`LazyCache` (slots = ``state.shape[0]``, q / k heads H, the state's HV, K, V).
        num_accepted: None for plain decoding (the T rows commit at once); else ``[B]`` int32: the accepted count
            of the slot's previous step's pending rows (0..its T; values outside are clamped), and this step's T
            rows wait as pending.
        scale: q scale (default ``K ** -0.5``); use_qk_l2norm: l2-normalise q and k (eps 1e-6 under the root).
        softplus_beta, softplus_threshold: the decay gate's softplus (1.0, 20.0).
        null_block_id: an int >= -1: slots <= it are padding.
        output: optional ``[B, T, HV, V]`` bf16 / fp16 / fp32 (last dim contiguous); else allocated in q's dtype.
    """
    config = RUNNER.sync()
    tensors = (q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, output)
    try:
        sig = ("step", tuple(_sig(x) for x in tensors + tuple(cache)), scale, type(scale), use_qk_l2norm,
               type(use_qk_l2norm), softplus_beta, softplus_threshold, null_block_id, type(null_block_id),
               (q.data_ptr() | k.data_ptr() | v.data_ptr() | state.data_ptr() | cache[0].data_ptr()
                | cache[1].data_ptr()) & 15)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError, ValueError):  # a non-tensor argument: the checks report it
        sig = hit = None
    if hit is None:
        output, call = prepare_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache, num_accepted, scale,
                                    use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id, output)
        if call is None:
            return output
        hit = bind(call)
        remember(_memo, sig, (hit[0], tuple(output.shape), hit[1], hit[2]), config, _MEMO_MAX)
        bounds, dev, nbytes = hit
    else:
        bounds, out_shape, dev, nbytes = hit
        if output is None:
            output = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    scratch = scratch_for(nbytes, state.device)
    run(dev, bounds, step_pointers(q, k, v, a, b, A_log, dt_bias, state, state_indices, output, cache, num_accepted,
                                   scratch))
    return output


def step_pointers(q, k, v, a, b, A_log, dt_bias, state, state_indices, output, cache, num_accepted, scratch) -> tuple:
    """A step's per-call pointers, packed for its bound launches (:data:`STEP`)."""
    return STEP.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(), A_log.data_ptr(),
                     dt_bias.data_ptr(), state.data_ptr(), state_indices.data_ptr(), output.data_ptr(),
                     cache[0].data_ptr(), cache[1].data_ptr(), cache[2].data_ptr(), cache[3].data_ptr(),
                     0 if num_accepted is None else num_accepted.data_ptr(), address(scratch))


def gated_delta_rule_lazy_fold(state: torch.Tensor, state_indices: torch.Tensor, cache: LazyCache, *,
                               num_accepted: Optional[torch.Tensor] = None, null_block_id: int = -1) -> None:
    """Fold the committed rows of the chosen slots into their checkpoints and empty their rings: afterwards
    ``state[slot]`` is the slot's current state (a request finishes, is preempted, is saved as a prefix, or a
    prefill continues from it). ``state_indices [B]``: the slots (padding as in the step); ``num_accepted``: the
    accepted count of the slots' last speculative step (its pending rows), None for 0. Arguments as in
    :func:`gated_delta_rule_lazy_step`."""
    config = RUNNER.sync()
    try:
        sig = ("fold", tuple(_sig(x) for x in (state, state_indices, num_accepted) + tuple(cache)), null_block_id,
               type(null_block_id), (state.data_ptr() | cache[0].data_ptr() | cache[1].data_ptr()) & 15)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError, ValueError):
        sig = hit = None
    if hit is None:
        call = prepare_fold(state, state_indices, cache, num_accepted, null_block_id, "fold")
        if call is None:
            return
        hit = bind(call)
        remember(_memo, sig, hit, config, _MEMO_MAX)
    bounds, dev, nbytes = hit
    scratch = scratch_for(nbytes, state.device)
    run(dev, bounds, FOLD.pack(state.data_ptr(), state_indices.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(),
                               cache[2].data_ptr(), cache[3].data_ptr(),
                               0 if num_accepted is None else num_accepted.data_ptr(), address(scratch)))


def gated_delta_rule_lazy_reset(state_indices: torch.Tensor, cache: LazyCache, *, null_block_id: int = -1) -> None:
    """Empty the rings of the chosen slots without folding (a prefill wrote a fresh checkpoint to them).
    ``state_indices [B]`` int32 / int64 (padding as in the step)."""
    config = RUNNER.sync()
    try:
        sig = ("reset", tuple(_sig(x) for x in (state_indices,) + tuple(cache)), null_block_id, type(null_block_id))
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError, ValueError):
        sig = hit = None
    if hit is None:
        call = prepare_fold(None, state_indices, cache, None, null_block_id, "reset")
        if call is None:
            return
        hit = bind(call)
        remember(_memo, sig, hit, config, _MEMO_MAX)
    bounds, dev, _ = hit
    run(dev, bounds, RESET.pack(state_indices.data_ptr(), cache[3].data_ptr()))


def launches(call: KernelCall) -> tuple:
    """``(calls, scratch bytes)``: the launches of a named step or fold call in order, by the form the dispatcher
    picks for it: the call alone (tile and eager forms, a reset), or the spec's ``first_launch`` (the prep launch,
    with the call's window) and then the call (rows form), which share a scratch buffer of that many bytes (the
    spec's description)."""
    first = SPEC.first_launch_of(call.params, dict(RUNNER.variant(call).tunables))
    if first is None:
        return (call,), 0
    params, pinned = first
    f = call.facts
    prep = dataclasses.replace(call, params=params, pinned=pinned)
    return (prep, call), scratch_bytes(f["B"], f["H"], f["HV"], call.params["K"], call.params["T"])


def scratch_bytes(B: int, H: int, HV: int, K: int, T: int) -> int:
    """The rows form's scratch: [B] int4 window records, [B, H, 2T, K] fp32 keys, [B, HV, tab_words] fp32 tables
    (gdn_lazy_rows.cu.j2's layout; tab_words as the spec's derived value)."""
    tab_words = (2 * T * (16 + T) + 2 * T + 17 + 3) // 4 * 4
    return B * 16 + B * H * 2 * T * K * 4 + B * HV * tab_words * 4


def bind(call: KernelCall) -> tuple:
    """``(bound launches, device, scratch bytes)`` of a named call (:func:`launches`)."""
    calls, nbytes = launches(call)
    return tuple(RUNNER.bind(c) for c in calls), call.device, nbytes


def scratch_for(nbytes: int, device) -> Optional[torch.Tensor]:
    """A fresh scratch buffer for a call's launches (None: no bytes). Held until they are queued; torch's caching
    allocator then hands the block only to later work of the stream (or of a captured graph)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def address(x: Optional[torch.Tensor]) -> int:
    """A tensor's address, 0 for None."""
    return 0 if x is None else x.data_ptr()


def run(dev: int, bounds: tuple, pointers: tuple) -> None:
    """Launch a call's bound launches in order with its per-call pointers."""
    for bound in bounds:
        launch_on(dev, bound, pointers)


def check_state(state, require_cuda: bool = True) -> tuple:
    """A checkpoint pool ``[slots, HV, V, K]``: dtype, dims, K contiguous, 16-byte aligned pieces; (slots, HV, V, K)."""
    (_v.cuda_tensor if require_cuda else _v.tensor)("state", state, 4)
    _v.dtype_in("state", state, STATE_DTYPES)
    slots, HV, V, K = state.shape
    if K not in SUPPORTED_DIMS or V not in SUPPORTED_DIMS:
        raise ValueError(f"state: K and V (dims 3, 2) must be in {SUPPORTED_DIMS}, got shape {tuple(state.shape)}")
    if state.stride(3) != 1:
        raise ValueError(f"state: expected K (dim 3) contiguous, got strides {state.stride()}")
    _v.aligned("state", state, 16)
    return slots, HV, V, K


def check_rings(names: tuple, k_ring, u_ring, g_ring, slots: int, H: Optional[int], HV: int, K: int, V: int,
                rows: int, device, dtypes=RING_DTYPES) -> int:
    """The three ring tensors, called ``names`` in messages: keys ``[slots, H, rows, K]``, corrections ``[slots, HV,
    rows, V]`` (the keys' dtype), log decays ``[slots, HV, rows]`` fp32; dims after the slot dim dense, the slot
    pitch free (the keys' and corrections': 16-byte aligned, as their bases); returns H."""
    kn, un, gn = names
    for name, x, nd in ((kn, k_ring, 4), (un, u_ring, 4), (gn, g_ring, 3)):
        _v.tensor(name, x, nd)
        _v.same_device(name, x, device)
    Hk = k_ring.shape[1] if H is None else H
    if Hk < 1 or HV % Hk:
        raise ValueError(f"{kn}: its heads H (dim 1) must divide HV={HV}, got shape {tuple(k_ring.shape)}")
    _v.dtype_in(kn, k_ring, dtypes)
    _v.dtype_in(un, u_ring, (k_ring.dtype,))
    _v.dtype_in(gn, g_ring, (torch.float32,))
    for name, x, shape, what in ((kn, k_ring, (slots, Hk, rows, K), f"[slots, H, {rows}, K]"),
                                 (un, u_ring, (slots, HV, rows, V), f"[slots, HV, {rows}, V]"),
                                 (gn, g_ring, (slots, HV, rows), f"[slots, HV, {rows}]")):
        _v.shape_is(name, x, shape, what)
        dense = torch.empty(shape[1:], device="meta").stride()
        if tuple(x.stride()[1:]) != tuple(dense):
            raise ValueError(f"{name}: expected its dims after the slot dim dense (strides {dense}), got strides "
                             f"{x.stride()}")
    _v.aligned(kn, k_ring, 16)  # the kernels read the key rows in 16-byte pieces
    _v.aligned(un, u_ring, 16)  # and the correction rows (the tile form's, staged as they are)
    return Hk


def check_cache(cache, slots: int, H: Optional[int], HV: int, K: int, V: int, device) -> int:
    """A :class:`LazyCache` for this pool; returns its H."""
    if not isinstance(cache, tuple) or len(cache) != 4:
        raise TypeError(f"cache: expected a LazyCache (k, u, g, cursor), got {type(cache).__name__}")
    Hk = check_rings(("cache.k", "cache.u", "cache.g"), cache[0], cache[1], cache[2], slots, H, HV, K, V, RING,
                     device)
    _v.dense_buffer("cache.cursor", cache[3], (slots, 4), (torch.int32,), device, "[slots, 4]", vector=False)
    return Hk


def check_inputs(q, k, v, a, b, A_log, dt_bias, B: int, HV: int, K: int, V: int, device) -> tuple:
    """The token inputs of a step (feature and head dims contiguous) and the gate parameters; returns (T, H)."""
    T, H = check_tokens(q, k, v, a, b, B, HV, K, V, device)
    for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        _v.inner_contiguous(name, x)
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        _v.tensor(name, x, 1)
        _v.dtype_in(name, x, GATE_DTYPES)
        _v.same_device(name, x, device)
        _v.shape_is(name, x, (HV,), "[HV]")
        _v.inner_contiguous(name, x)
    return T, H


def gate_values(scale, softplus_beta, softplus_threshold, K: int) -> tuple:
    """(scale, softplus_beta, softplus_threshold) as floats: scale default ``K ** -0.5``, scale and beta > 0."""
    scale = K ** -0.5 if scale is None else _v.real_number("scale", scale)
    if not scale > 0:
        raise ValueError(f"scale: expected a positive float, got {scale!r}")
    softplus_beta = _v.real_number("softplus_beta", softplus_beta)
    softplus_threshold = _v.real_number("softplus_threshold", softplus_threshold)
    if not softplus_beta > 0:
        raise ValueError(f"softplus_beta: expected a positive float, got {softplus_beta!r}")
    return scale, softplus_beta, softplus_threshold


def token_args(q, k, v, a, b, output) -> dict:
    """The per-token tensors' strides, by the spec's names."""
    return dict(q_sn=q.stride(0), q_st=q.stride(1), q_sh=q.stride(2), k_sn=k.stride(0), k_st=k.stride(1),
                k_sh=k.stride(2), v_sn=v.stride(0), v_st=v.stride(1), v_sh=v.stride(2), a_sn=a.stride(0),
                a_st=a.stride(1), b_sn=b.stride(0), b_st=b.stride(1), o_sn=output.stride(0), o_st=output.stride(1),
                o_sh=output.stride(2))


def prepare_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache, num_accepted, scale, use_qk_l2norm,
                 softplus_beta, softplus_threshold, null_block_id, output, *, require_cuda: bool = True):
    """Every check of a step; ``(output, call)`` with the named :class:`~gdnjit.runner.KernelCall` (None: nothing to
    run)."""
    slots, HV, V, K = check_state(state, require_cuda)
    device = state.device
    use_qk_l2norm = _v.boolean("use_qk_l2norm", use_qk_l2norm)
    _v.null_block("null_block_id", null_block_id)
    _v.tensor("state_indices", state_indices, 1)
    B = state_indices.shape[0]
    _v.index_tensor("state_indices", state_indices, B, device)
    T, H = check_inputs(q, k, v, a, b, A_log, dt_bias, B, HV, K, V, device)
    check_cache(cache, slots, H, HV, K, V, device)
    if num_accepted is not None:
        _v.dense_buffer("num_accepted", num_accepted, (B,), (torch.int32,), device, f"[B={B}]", vector=False)
    scale, softplus_beta, softplus_threshold = gate_values(scale, softplus_beta, softplus_threshold, K)
    zero_pad = output is None
    output = step_output(output, q.dtype, B, T, HV, V, device)
    if B == 0:
        return output, None
    if get_config().check_indices:
        host_check_slots("state_indices", state_indices, slots, null_block_id)
    params = dict(mode="step", pending=num_accepted is not None, K=K, V=V, T=T,
                  in_dtype=_v.FLOAT_NAMES[q.dtype], out_dtype=_v.FLOAT_NAMES[output.dtype],
                  state_dtype=_v.FLOAT_NAMES[state.dtype], ring_dtype=_v.FLOAT_NAMES[cache[0].dtype],
                  alog_dtype=_v.FLOAT_NAMES[A_log.dtype], dtb_dtype=_v.FLOAT_NAMES[dt_bias.dtype],
                  idx_dtype=_v.INDEX_NAMES[state_indices.dtype], l2norm=use_qk_l2norm, zero_pad=zero_pad)
    args = dict(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), a=a.data_ptr(), b=b.data_ptr(),
                A_log=A_log.data_ptr(), dt_bias=dt_bias.data_ptr(), state=state.data_ptr(),
                idx=state_indices.data_ptr(), out=output.data_ptr(), k_ring=cache[0].data_ptr(),
                u_ring=cache[1].data_ptr(), g_ring=cache[2].data_ptr(), cursor=cache[3].data_ptr(),
                acc=0 if num_accepted is None else num_accepted.data_ptr(), **token_args(q, k, v, a, b, output),
                **pool_args(state, cache[0], cache[1], cache[2]), null_block=null_block_id, scale=scale,
                softplus_beta=softplus_beta, softplus_threshold=softplus_threshold, B=B, H=H, HV=HV)
    dev = launch_device(device, require_cuda)
    return output, STEP.call(params, dict(B=B, H=H, HV=HV), args, dev, pdl=uses_pdl(dev) if require_cuda else False)


def step_output(output, dtype: torch.dtype, B: int, T: int, HV: int, V: int, device) -> torch.Tensor:
    """A step's output: ``output`` checked (``[B, T, HV, V]``, an output dtype, last dim contiguous, on ``device``), or
    a new one of ``dtype`` when None."""
    if output is None:
        return torch.empty((B, T, HV, V), dtype=dtype, device=device)
    _v.given_output(output, (B, T, HV, V), "[B, T, HV, V]", OUT_DTYPES, device)
    return output


def host_check_slots(name: str, idx: torch.Tensor, slots: int, null_block_id: int) -> None:
    """GDNJIT_CHECK_INDICES: the kernel's trap (a slot past the pool) as an IndexError, and a live slot named twice
    (its ring rows and cursor would be written twice) as a ValueError; reads the device (synchronises)."""
    _v.host_index_in_range(name, idx, slots)
    live = idx[(idx > null_block_id) & (idx >= 0)]
    if live.numel() != torch.unique(live).numel():
        values, counts = torch.unique(live, return_counts=True)
        raise ValueError(f"{name}: each slot may appear once per call, got slot(s) {values[counts > 1].tolist()[:4]} "
                         f"more than once")


def pool_args(state, k_ring, u_ring, g_ring) -> dict:
    """The pool's and the rings' strides, by the spec's names; requires the state's pieces 16-byte aligned."""
    for name, s in (("slot", state.stride(0)), ("head", state.stride(1)), ("row", state.stride(2))):
        if state.shape[0 if name == "slot" else 1 if name == "head" else 2] > 1 and (s * state.element_size()) % 16:
            raise ValueError(f"state: the {name} stride must be a multiple of 16 bytes (16-byte loads), got "
                             f"{s} elements")
    return dict(s_slot=state.stride(0), s_head=state.stride(1), s_row=state.stride(2), kr_slot=k_ring.stride(0),
                ur_slot=u_ring.stride(0), gr_slot=g_ring.stride(0), pool_size=state.shape[0])


def prepare_fold(state, state_indices, cache, num_accepted, null_block_id, mode: str, *, require_cuda: bool = True):
    """Every check of a fold (``mode`` 'fold') or a reset ('reset', no state); the named call or None."""
    _v.null_block("null_block_id", null_block_id)
    if mode == "fold":
        slots, HV, V, K = check_state(state, require_cuda)
        device = state.device
        H = check_cache(cache, slots, None, HV, K, V, device)
    else:
        if not isinstance(cache, tuple) or len(cache) != 4:
            raise TypeError(f"cache: expected a LazyCache (k, u, g, cursor), got {type(cache).__name__}")
        (_v.cuda_tensor if require_cuda else _v.tensor)("cache.cursor", cache[3], 2)
        device = cache[3].device
        slots = cache[3].shape[0]
        _v.dense_buffer("cache.cursor", cache[3], (slots, 4), (torch.int32,), device, "[slots, 4]", vector=False)
        H = HV = 1
        K = V = 128
    _v.tensor("state_indices", state_indices, 1)
    B = state_indices.shape[0]
    _v.index_tensor("state_indices", state_indices, B, device)
    if num_accepted is not None:
        _v.dense_buffer("num_accepted", num_accepted, (B,), (torch.int32,), device, f"[B={B}]", vector=False)
    if B == 0:
        return None
    if get_config().check_indices:
        host_check_slots("state_indices", state_indices, slots, null_block_id)
    params = dict(mode=mode, K=K, V=V, state_dtype=_v.FLOAT_NAMES[state.dtype] if state is not None else "fp32",
                  ring_dtype=_v.FLOAT_NAMES[cache[0].dtype] if mode == "fold" else "bf16",  # a reset reads no ring
                  idx_dtype=_v.INDEX_NAMES[state_indices.dtype])
    args = dict(idx=state_indices.data_ptr(), cursor=cache[3].data_ptr(), null_block=null_block_id, B=B, H=H, HV=HV,
                pool_size=slots)
    if mode == "fold":
        args.update(state=state.data_ptr(), k_ring=cache[0].data_ptr(), u_ring=cache[1].data_ptr(),
                    g_ring=cache[2].data_ptr(), acc=0 if num_accepted is None else num_accepted.data_ptr(),
                    **pool_args(state, cache[0], cache[1], cache[2]))
    dev = launch_device(device, require_cuda)
    mode_obj = FOLD if mode == "fold" else RESET
    return mode_obj.call(params, dict(B=B, H=H, HV=HV), args, dev, pdl=uses_pdl(dev) if require_cuda else False)


def untunable(params: dict) -> Optional[str]:
    """Why ``gdnjit tune`` does not time calls of these params (None: it does, by :func:`example_steps`)."""
    if params["mode"] == "prep":
        return "a prep launch is timed with its step (its window the step's)"
    if params["mode"] in ("fold", "reset"):
        return "a fold or a reset keeps the rules' choice (its time is that of the rings it empties)"
    if params["cursor"] == "row":
        return "FlashInfer's cursors are the caller's (its folds follow the caller's hist_len), so the rules choose"
    return None


TUNE_WHERE = "form != 'eager' or state_dtype == 'fp32'"
"""The candidates ``gdnjit tune`` measures: not a 16-bit state's eager form (it rounds the state once a token where
the lazy forms round it once a fold: a tuned table changes the speed, not the arithmetic's contract)."""


def fold_cycle(T: int, window: int, accepted: Optional[int]) -> int:
    """Steps after which a slot's cursor repeats, for steady steps of T tokens with ``accepted`` of each previous
    step's T pending rows accepted (None: plain steps): gdnjit's cursor rule (:mod:`gdnjit.reference.lazy`), from an
    empty ring, its first steps left out."""
    seen, n, pend, k = {}, 0, 0, 0
    while (n, pend) not in seen:
        seen[(n, pend)] = k
        P = n + (0 if accepted is None else min(accepted, pend))
        fold = P + T > window
        n, pend = (0 if fold else P) + (T if accepted is None else 0), (0 if accepted is None else T)
        k += 1
    return k - seen[(n, pend)]


def example_steps(params: dict, facts: dict, device, n_sets_for):
    """``gdnjit tune``'s timing of a step call (mode ``step``, gdnjit's cursors): ``(n_sets, steps_for)``. The input
    sets (a pool of B + 1 slots, its cache, B random distinct slots, tokens; speculative steps with a steady
    ``max(1, T // 2)`` of each step's T rows accepted) are as many as ``n_sets_for`` asks for one set's bytes;
    ``steps_for(tunables)`` zeroes their cursors and gives ``(fn, calls)``: ``fn(i)`` launches one step on set i with
    those tunables pinned (its rows-form prep with their window, as :func:`launches` does), and ``calls`` covers whole
    fold cycles of every set (:func:`fold_cycle`), so a graph of them times the step amortised over its folds."""
    dtypes = {name: t for t, name in (*_v.FLOAT_NAMES.items(), *_v.INDEX_NAMES.items())}
    B, H, HV = facts["B"], facts["H"], facts["HV"]
    T, K, V = params["T"], params["K"], params["V"]
    td = lambda name: dtypes[params[name]]  # noqa: E731
    g = torch.Generator(device=device).manual_seed(0)
    r = lambda *shape: torch.randn(*shape, device=device, generator=g)  # noqa: E731
    accepted = max(1, T // 2) if params["pending"] else None
    slots = B + 1
    sets = []
    while True:
        idx = torch.randperm(slots, device=device, generator=g)[:B].to(td("idx_dtype"))
        x = dict(q=r(B, T, H, K).to(td("in_dtype")), k=r(B, T, H, K).to(td("in_dtype")),
                 v=r(B, T, HV, V).to(td("in_dtype")), a=r(B, T, HV).to(td("in_dtype")),
                 b=r(B, T, HV).to(td("in_dtype")), A_log=(r(HV) * 0.5).to(td("alog_dtype")),
                 dt_bias=r(HV).to(td("dtb_dtype")), state=(r(slots, HV, V, K) * 0.1).to(td("state_dtype")), idx=idx,
                 cache=lazy_cache(slots, H, HV, K, V, dtype=td("ring_dtype"), device=device),
                 acc=None if accepted is None else torch.full((B,), accepted, dtype=torch.int32, device=device),
                 out=None if params["zero_pad"] else torch.empty((B, T, HV, V), dtype=td("out_dtype"), device=device))
        sets.append(x)
        nbytes = sum(t.numel() * t.element_size() for t in (*x["cache"], x["state"], x["q"], x["k"], x["v"]))
        if len(sets) >= n_sets_for(nbytes):
            break

    def steps_for(tunables: dict):
        launches = []
        for x in sets:
            x["cache"].cursor.zero_()
            out, call = prepare_step(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["dt_bias"], x["b"], x["state"],
                                     x["idx"], x["cache"], x["acc"], None, params["l2norm"], 1.0, 20.0, -1, x["out"])
            bounds, dev, nbytes = bind(dataclasses.replace(call, pinned=tunables))
            scratch = scratch_for(nbytes, x["state"].device)
            pointers = step_pointers(x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"],
                                     x["idx"], out, x["cache"], x["acc"], scratch)
            launches.append((dev, bounds, pointers, out, scratch))  # out and scratch held while the graph lives
        cycle = fold_cycle(T, tunables["window"], accepted)
        steps = cycle * -(-16 // cycle)  # at least 16 steps a set, whole cycles
        return (lambda i: run(*launches[i][:3])), len(sets) * steps

    return len(sets), steps_for
