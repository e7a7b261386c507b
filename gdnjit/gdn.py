"""Gated delta rule (GDN) decode and multi-token ops, FlashInfer-compatible signatures.

This module only validates arguments and builds a named :class:`~gdnjit.runner.KernelCall` of the
``gdn`` spec (``specs/gdn.yaml``, ``templates/gdn_{form}.cu.j2``: one template per kernel form);
:mod:`gdnjit.runner` dispatches, compiles, binds and launches it.

Semantics (docs/design.md section 4), per batch row n, value head hv (h = hv // (HV // H)), token t::

    g    = exp(-exp(A_log[hv]) * softplus(a[n,t,hv] + dt_bias[hv]))
    beta = sigmoid(b[n,t,hv])
    q^ = l2norm(q[n,t,h]) * scale,  k^ = l2norm(k[n,t,h])      (no l2norm: q * scale, k)
    S  = g * S;  u = (v[n,t,hv] - S k^) * beta;  S = S + u k^T;  o[n,t,hv] = S q^

All math is fp32 whatever the storage dtypes; a bf16 state is rounded once per write.
See ``docs/api.md`` for the table of argument combinations.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from . import guard as _guard
from . import recovery as _recovery
from . import validate as _v
from .call_mode import CallMode
from .config import get_config
from .errors import DtypeError
from .gdn_core import (IN_DTYPES, MAX_T, NATIVE_CONVENTIONS, OUT_DTYPES, SPEC, STATE_DTYPES, SUPPORTED_DIMS,
                       check_indices, launch_device, uses_pdl)
from .gdn_engine import engine_step
from .runner import RUNNER, launch_on, remember

__all__ = ["gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode", "gated_delta_rule_mtp", "run",
           "prepare", "plan_pretranspose", "plan_mtp", "MtpPlan", "pool_args", "check_backend", "MAX_T",
           "SUPPORTED_DIMS", "NATIVE_CONVENTIONS"]

# FlashInfer's decode and multi-token calls: the pointers this mode passes per call, by name.
NATIVE = CallMode(SPEC, "native", ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "read_idx", "write_idx",
                                   "out", "inter", "ssm_idx"))
_OUT = NATIVE.pointers.index("out")

_fast: dict = RUNNER.memo()  # call signature -> (BoundLaunch, output shape, device); see run
_FAST_MAX = 4096
# flags + which optionals are present -> [(guard, (BoundLaunch, output shape, device)), ...], most recent first
_guarded: dict = RUNNER.memo()
_GUARDS_PER_KEY = 4


def _meta(x):
    """The metadata every check reads, for a present optional tensor."""
    return x.shape, x.stride(), x.dtype, x.get_device()


def run(layout: str, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output, inter, ssm,
        update: bool, l2norm: bool, direct: bool, zero_padding: bool = True, write_once: bool = False) -> torch.Tensor:
    """Validate, then launch one kernel. ``pool`` is the direct state when ``direct``.

    Hot path: every check depends only on tensor metadata (shape, strides, dtype, device, pointer
    alignment) and the flags, so a call whose metadata was validated before skips straight to
    gathering data pointers and launching a :class:`~gdnjit.launch.BoundLaunch` (its non-pointer
    arguments packed once). Two tiers: a C++ guard over the tensors passed (:mod:`gdnjit.guard`,
    ~0.1 us per tensor) keyed by the flags and which optional tensors are present, then a signature of
    the metadata read in Python, one flat tuple written out argument by argument (on the dev CPU 3.0 us
    against 6.8 us for a generator over the slots; docs/perf.md v7). Anything new (or any non-tensor)
    takes the full path.
    """
    config = RUNNER.sync()  # a replaced configuration drops the memos below
    try:
        # NATIVE's pointers, in its order
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), A_log.data_ptr(), a.data_ptr(), dt_bias.data_ptr(),
                b.data_ptr(), pool.data_ptr(), 0 if read_idx is None else read_idx.data_ptr(),
                0 if write_idx is None else write_idx.data_ptr(), 0 if output is None else output.data_ptr(),
                0 if inter is None else inter.data_ptr(), 0 if ssm is None else ssm.data_ptr())
        # types too: True == 1 == 1.0 hash alike, and a bool scale / int flag must still be refused
        gkey = (layout, direct, update, l2norm, type(l2norm), scale, type(scale),
                (ptrs[0] | ptrs[1] | ptrs[7] | ptrs[11]) & 15, read_idx is None, write_idx is None, output is None,
                inter is None, ssm is None, zero_padding, write_once)  # the alignment of q, k, state, inter
        hit = None
        guards = _guarded.get(gkey)
        if guards is not None:
            slots = _slots(q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, output, inter, ssm)
            for guard, entry in guards:
                if guard.check(*slots):
                    hit = entry
                    break
    except (AttributeError, TypeError, RuntimeError):  # a non-tensor / sparse argument: the full path reports it
        hit = gkey = None
    if hit is None and gkey is not None:
        try:
            hit, sig = _signature_hit(layout, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale,
                                      output, inter, ssm, update, l2norm, direct, gkey[7], zero_padding, write_once)
        except (AttributeError, TypeError, RuntimeError):
            hit = sig = None
        # a signature hit adds a guard only while the key has room, so calls cycling through more
        # metadata sets than _GUARDS_PER_KEY never pay a guard's construction (~10 us) per call
        if hit is not None and len(_guarded.get(gkey, ())) < _GUARDS_PER_KEY:
            _remember_guard(gkey, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, output, inter, ssm, hit)
    else:
        sig = None
    if hit is not None:
        bound, out_shape, dev = hit
        if output is None:
            output = torch.empty(out_shape, dtype=q.dtype, device=q.device)
            ptrs = ptrs[:_OUT] + (output.data_ptr(),) + ptrs[_OUT + 1:]
        ptrs = NATIVE.pack(*ptrs)
    else:
        output, call = prepare(layout, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output,
                               inter, ssm, update, l2norm, direct, zero_padding=zero_padding, write_once=write_once)
        if call is None:
            return output
        dev = call.device
        bound = RUNNER.bind(call)
        ptrs = NATIVE.pointer_values(call)
        # no guard yet: the second call with this metadata adds one (a signature hit, above), so a
        # process that calls once pays neither a guard nor torch's guard self-test (~9 ms, first call)
        remember(_fast, sig, (bound, tuple(output.shape), dev), config, _FAST_MAX)
    launch_on(dev, bound, ptrs)
    return output


def _slots(q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, output, inter, ssm):
    """The tensors a guard checks: the eight every call has, then the optional ones present. Which ones are
    present is part of the guard's key (``gkey`` in :func:`run`), so one guard always sees the same slots
    (a checked slot costs ~0.08 us on the dev CPU, so absent ones are left out)."""
    s = (q, k, v, A_log, a, dt_bias, b, pool)
    if read_idx is not None:
        s += (read_idx,)
    if write_idx is not None:
        s += (write_idx,)
    if output is not None:
        s += (output,)
    if inter is not None:
        s += (inter,)
    if ssm is not None:
        s += (ssm,)
    return s


def _remember_guard(gkey, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, output, inter, ssm, entry):
    """Put a guard of these tensors' metadata first in ``gkey``'s list (at most _GUARDS_PER_KEY)."""
    slots = _slots(q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, output, inter, ssm)
    try:
        g = _guard.make(slots)
    except Exception:  # e.g. one object in two slots: the signature path serves this call
        return
    if g is None or not g.check(*slots):
        return
    guards = _guarded.get(gkey, [])
    _guarded[gkey] = [(g, entry)] + guards[:_GUARDS_PER_KEY - 1]


def _signature_hit(layout, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output, inter, ssm,
                   update, l2norm, direct, align, zero_padding, write_once):
    """(memoised launch or None, signature): the metadata signature read in Python and its _fast entry."""
    sig = (layout, direct, update, l2norm, type(l2norm), scale, type(scale), align, zero_padding, write_once,
           q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device(), a.shape, a.stride(), a.dtype, a.get_device(),
           b.shape, b.stride(), b.dtype, b.get_device(), pool.shape, pool.stride(), pool.dtype, pool.get_device(),
           A_log.shape, A_log.stride(), A_log.dtype, A_log.get_device(),
           dt_bias.shape, dt_bias.stride(), dt_bias.dtype, dt_bias.get_device(),
           None if output is None else (output.shape, output.stride(), output.dtype, output.get_device()),
           None if read_idx is None else _meta(read_idx), None if write_idx is None else _meta(write_idx),
           None if inter is None else _meta(inter), None if ssm is None else _meta(ssm))
    return _fast.get(sig), sig


def prepare(layout: str, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output, inter, ssm,
            update: bool, l2norm: bool, direct: bool, require_cuda: bool = True, zero_padding: bool = True,
            write_once: bool = False):
    """All argument checks; returns (output, the named :class:`~gdnjit.runner.KernelCall`, or None if B == 0).

    ``require_cuda=False`` lets CPU tests exercise every other check with CPU tensors (the call is then
    built for device 0 without PDL). ``zero_padding``: padding rows (negative read index) get zero outputs;
    False leaves those rows of ``output`` as they were (FlashInfer's multi-token convention for a caller's buffer).
    ``write_once``: ``ssm`` is a state-recovery write map (at most one live entry per row; :mod:`gdnjit.recovery`).
    """
    # --- inputs ---------------------------------------------------------------------------
    (_v.cuda_tensor if require_cuda else _v.tensor)("q", q, 4)
    _v.dtype_in("q", q, IN_DTYPES)
    B, T, H, K = q.shape
    device = q.device
    if K not in SUPPORTED_DIMS:
        raise ValueError(f"q: head dim K must be one of {SUPPORTED_DIMS}, got {K}")
    if not 1 <= T <= MAX_T:
        raise ValueError(f"q: number of tokens T (dim 1) must be in 1..{MAX_T}, got {T}")
    if H < 1:
        raise ValueError(f"q: number of heads H must be >= 1, got {H}")
    _v.tensor("k", k, 4)
    if k.dtype != q.dtype:
        raise DtypeError(f"k: expected the dtype of q ({q.dtype}), got {k.dtype}")
    _v.same_device("k", k, device)
    _v.shape_is("k", k, q.shape, "q.shape")
    _v.tensor("v", v, 4)
    if v.dtype != q.dtype:
        raise DtypeError(f"v: expected the dtype of q ({q.dtype}), got {v.dtype}")
    _v.same_device("v", v, device)
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V], got {tuple(v.shape)}")
    HV, V = _v.value_heads(q, k, v, SUPPORTED_DIMS)
    for name, x in (("a", a), ("b", b)):
        _v.tensor(name, x, 3)
        if x.dtype != q.dtype:
            raise DtypeError(f"{name}: expected the dtype of q ({q.dtype}), got {x.dtype}")
        _v.same_device(name, x, device)
        _v.shape_is(name, x, (B, T, HV), "[B, T, HV]")
    _v.gate_params(A_log, dt_bias, HV, device)
    if scale is None:
        scale = K ** -0.5
    else:
        scale = _v.real_number("scale", scale)
    l2norm = _v.boolean("use_qk_l2norm", l2norm)

    # --- state / pool ----------------------------------------------------------------------
    sname = "state" if direct else "initial_state"
    _v.tensor(sname, pool, 4)
    _v.dtype_in(sname, pool, STATE_DTYPES)
    _v.same_device(sname, pool, device)
    trailing = (HV, V, K) if layout == "klast" else (HV, K, V)
    what = "[B, HV, V, K]" if layout == "klast" else "[B, HV, K, V]"
    if not direct:
        what = what.replace("[B,", "[pool_size,")
    pool_size = pool.shape[0]
    if tuple(pool.shape[1:]) != trailing or (direct and pool_size != B):
        lead = B if direct else "pool_size"
        raise ValueError(f"{sname}: expected shape {what} = [{lead}, {', '.join(map(str, trailing))}], got {tuple(pool.shape)}")
    dense = (trailing[1] * trailing[2], trailing[2], 1)
    slot_strided = pool.stride()[1:] != dense
    _, s_head, s_row, s_last = pool.stride()
    if slot_strided:  # a strided view of a bigger state (FlashInfer's non-contiguous pools): last dim contiguous
        rows, row_len = trailing[1], trailing[2]
        if s_last != 1:
            raise ValueError(f"{sname}: the last dim ({'K' if layout == 'klast' else 'V'}) must be contiguous, "
                             f"got strides {pool.stride()}")
        if (rows > 1 and s_row < row_len) or (HV > 1 and s_head < (rows - 1) * s_row + row_len):
            raise ValueError(f"{sname}: a slot's rows or heads overlap (strides {pool.stride()}; rows need a stride "
                             f">= {row_len}, heads >= {rows - 1} * row stride + {row_len})")
    _v.aligned(sname, pool, 16)
    slot_stride = pool.stride(0)
    extent = 1 + sum((n - 1) * st for n, st in zip(trailing, pool.stride()[1:]))  # elements a slot spans
    if pool_size > 1 and slot_stride < extent:
        raise ValueError(f"{sname}: slots overlap (slot stride {slot_stride} < the {extent} elements a slot spans"
                         f"{'' if slot_strided else ' = HV*V*K'})")

    if direct:
        idx_dtype, same_pool = "int32", True
    else:
        check_indices("initial_state_indices", read_idx, B, device)
        idx_dtype = _v.INDEX_NAMES[read_idx.dtype]
        same_pool = write_idx is None
        if write_idx is not None:
            check_indices("output_state_indices", write_idx, B, device, like=read_idx)

    if not update and write_idx is not None:
        raise ValueError("output_state_indices: has no effect with disable_state_update=True; pass None")

    inter_dtype = "none"
    if inter is not None:
        _v.tensor("intermediate_states_buffer", inter, 5)
        _v.dtype_in("intermediate_states_buffer", inter, STATE_DTYPES)
        _v.same_device("intermediate_states_buffer", inter, device)
        if inter.shape[0] < B or inter.shape[1] < T or tuple(inter.shape[2:]) != trailing:
            raise ValueError(
                f"intermediate_states_buffer: expected shape [>= B={B}, cache_steps >= T={T}, "
                f"{', '.join(map(str, trailing))}], got {tuple(inter.shape)}"
            )
        if not inter.is_contiguous():
            raise ValueError("intermediate_states_buffer: expected a contiguous tensor")
        _v.aligned("intermediate_states_buffer", inter, 16)
        inter_dtype = _v.FLOAT_NAMES[inter.dtype]

    ssm_dtype = "none"
    if ssm is not None:
        if direct:
            raise ValueError("ssm_state_indices: needs a state pool (initial_state + initial_state_indices)")
        if inter is not None:
            raise ValueError("ssm_state_indices: cannot be combined with intermediate_states_buffer (pick one)")
        if not update:
            raise ValueError("ssm_state_indices: writes pool slots, so disable_state_update must be False")
        _v.tensor("ssm_state_indices", ssm, 2)
        _v.dtype_in("ssm_state_indices", ssm, _v.INDEX_NAMES)
        _v.same_device("ssm_state_indices", ssm, device)
        _v.shape_is("ssm_state_indices", ssm, (B, T), "[B, T]")
        ssm_dtype = _v.INDEX_NAMES[ssm.dtype]

    # --- output ----------------------------------------------------------------------------
    if output is None:
        output = torch.empty((B, T, HV, V), dtype=q.dtype, device=device)
    else:
        _v.given_output(output, (B, T, HV, V), "[B, T, HV, V]", OUT_DTYPES, device)
    if B == 0:
        return output, None

    if get_config().check_indices and not direct:
        for name, x in (("initial_state_indices", read_idx), ("output_state_indices", write_idx),
                        ("ssm_state_indices", ssm)):
            if x is not None:
                _v.host_index_in_range(name, x, pool_size)

    params = dict(layout=layout, K=K, V=V, T=T, in_dtype=_v.FLOAT_NAMES[q.dtype],
                  out_dtype=_v.FLOAT_NAMES[output.dtype], state_dtype=_v.FLOAT_NAMES[pool.dtype],
                  dtb_dtype=_v.FLOAT_NAMES[dt_bias.dtype], pool=not direct, idx_dtype=idx_dtype, same_pool=same_pool,
                  inter_dtype=inter_dtype, ssm_idx_dtype=ssm_dtype, update=update, l2norm=l2norm,
                  slot_strided=slot_strided, write_once=write_once and ssm is not None)
    dev = launch_device(device, require_cuda)
    (q_sn, q_st, q_sh), (k_sn, k_st, k_sh), (v_sn, v_st, v_sh) = q.stride()[:3], k.stride()[:3], v.stride()[:3]
    (a_sn, a_st, a_sh), (b_sn, b_st, b_sh), (o_sn, o_st, o_sh) = a.stride(), b.stride(), output.stride()[:3]
    ssm_sn, ssm_st = (0, 0) if ssm is None else ssm.stride()
    args = dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), A_log=A_log.data_ptr(), a=a.data_ptr(),
        dt_bias=dt_bias.data_ptr(), b=b.data_ptr(), state=pool.data_ptr(),
        read_idx=0 if direct else read_idx.data_ptr(), write_idx=0 if write_idx is None else write_idx.data_ptr(),
        out=output.data_ptr(), inter=0 if inter is None else inter.data_ptr(), ssm_idx=0 if ssm is None else ssm.data_ptr(),
        slot_stride=slot_stride, pool_size=pool_size, q_sn=q_sn, q_st=q_st, q_sh=q_sh, k_sn=k_sn, k_st=k_st, k_sh=k_sh,
        v_sn=v_sn, v_st=v_st, v_sh=v_sh, a_sn=a_sn, a_st=a_st, a_sh=a_sh, b_sn=b_sn, b_st=b_st, b_sh=b_sh,
        o_sn=o_sn, o_st=o_st, o_sh=o_sh, inter_sn=0 if inter is None else inter.stride(0), ssm_sn=ssm_sn, ssm_st=ssm_st,
        B=B, H=H, HV=HV, scale=scale, zero_padding=int(bool(zero_padding)), s_head=s_head, s_row=s_row,
        read_sn=0 if direct else read_idx.stride(0), inter_rows=0 if inter is None else inter.shape[0],
        gate_sh=A_log.stride(0), dtb_sh=dt_bias.stride(0),
    )
    call = NATIVE.call(params, dict(B=B, H=H, HV=HV), args, dev, pdl=uses_pdl(dev) if require_cuda else False)
    return output, call


BACKENDS_PRETRANSPOSE = ("auto", "flashinfer", "cake_gdn", "rubin")
BACKENDS_DECODE = ("auto", "flashinfer", "cake_gdn")


def check_backend(backend, allowed: Tuple[str, ...]) -> None:
    """FlashInfer's ``backend`` argument: ``"auto"`` and ``"flashinfer"`` run gdnjit's kernels (FlashInfer's
    "auto" falls back to its generic kernels wherever Cake / Rubin do not apply); FlashInfer's other
    backends are not provided (NotImplementedError naming it); anything else is a ValueError."""
    if not isinstance(backend, str) or backend not in allowed:
        raise ValueError(f"backend: expected one of {list(allowed)}, got {backend!r}")
    if backend not in ("auto", "flashinfer"):
        raise NotImplementedError(f"backend={backend!r}: FlashInfer's {backend} kernels are not provided by gdnjit; "
                                  "pass 'auto' or 'flashinfer' (gdnjit's kernels)")


_warned_none_default = False


def disable_flag(value, frozen_if_none: bool) -> bool:
    """FlashInfer's ``disable_state_update`` convention: any bool or int by its truth value; None means
    ``frozen_if_none`` (gated_delta_rule_mtp: True, with a one-time FutureWarning, as FlashInfer 0.7.2 does
    before its default becomes False)."""
    global _warned_none_default
    if value is None:
        if frozen_if_none and not _warned_none_default:
            import warnings

            warnings.warn("disable_state_update=None is treated as True (the state is not updated), as in "
                          "FlashInfer 0.7.2; pass True or False explicitly", FutureWarning, stacklevel=3)
            _warned_none_default = True
        return frozen_if_none
    return _v.truthy("disable_state_update", value)


def gated_delta_rule_decode_pretranspose(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: Optional[torch.Tensor],
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    initial_state: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    disable_state_update: Optional[bool] = False,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GDN decode with the state in K-last ("pretransposed") layout, updated in place.

    Args:
        q, k: ``[B, T, H, K]`` bf16/fp16 (K in 64/128/256; T = 1 for decode; T > 1, pool mode only, has
            :func:`gated_delta_rule_mtp`'s semantics). Last dim contiguous, 16-byte aligned rows.
        v: ``[B, T, HV, V]``, q's dtype; HV a multiple of H (GVA), V in 64/128/256.
        state: direct state ``[B, HV, V, K]`` fp32/bf16 (pass None in pool mode).
        A_log: ``[HV]`` fp32. a, b: ``[B, T, HV]`` in q's dtype. dt_bias: ``[HV]`` fp32/bf16/fp16.
        scale: query scale (default ``K ** -0.5``); a runtime value, no recompilation.
        output: optional ``[B, T, HV, V]`` bf16/fp16/fp32, written directly; else allocated in q's dtype.
        use_qk_l2norm: l2-normalise q and k (default True).
        initial_state: pool mode: ``[pool_size, HV, V, K]``; slots may be page-strided (slot
            stride any multiple of 16 bytes >= one slot), each slot's block contiguous.
        initial_state_indices: ``[B]`` int32/int64, the slot each row reads (and writes unless
            ``output_state_indices``). Negative: padding row (nothing read or written; its output rows are
            zeros at T = 1 or when ``output`` is allocated here, else left as they were).
        output_state_indices: ``[B]``, same dtype: write slots (split pool); negative: skip the writeback.
        intermediate_states_buffer, disable_state_update: T > 1 only, as in :func:`gated_delta_rule_mtp`
            (at T = 1 a buffer or a true ``disable_state_update`` is a ValueError, as in FlashInfer).
            ``disable_state_update`` is a bool or an int (its truth value); None: False, except for an fp32
            pool at T > 1, where it is True (FlashInfer forwards None to its mtp kernel there).
        backend: ``"auto"`` or ``"flashinfer"`` (gdnjit's kernels); FlashInfer's ``"cake_gdn"`` /
            ``"rubin"``: NotImplementedError; anything else: ValueError.

    Returns:
        ``(output, state)`` — ``state`` is the direct state or the pool, updated in place.

    Raises:
        TypeError / ValueError naming the argument for wrong types, dtypes, shapes, strides or devices.
        Out-of-range indices stop the kernel (``GDNJIT_CHECK_INDICES=1`` checks on the host instead).
    """
    frozen, zero_padding = plan_pretranspose(q, initial_state, output, intermediate_states_buffer,
                                             disable_state_update, backend)
    pool, read, write, direct = pool_args(state, initial_state, initial_state_indices, output_state_indices)
    out = run("klast", q, k, v, A_log, a, dt_bias, b, pool, read, write, scale, output, intermediate_states_buffer,
              None, not frozen, use_qk_l2norm, direct=direct, zero_padding=zero_padding)
    return out, pool


def plan_pretranspose(q, initial_state, output, intermediate_states_buffer, disable_state_update,
                      backend) -> Tuple[bool, bool]:
    """(frozen, zero_padding) of a ``decode_pretranspose`` call under FlashInfer 0.7.2's conventions, for both front
    doors (this module's function and :mod:`gdnjit.torch_ops`' wrapper): backend checked; at T = 1 no buffer and no frozen state; None freezes
    an fp32 pool at T > 1 only; padding rows are zeroed at T = 1 or in an output allocated here."""
    check_backend(backend, BACKENDS_PRETRANSPOSE)
    T = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else 1
    fp32_pool = isinstance(initial_state, torch.Tensor) and initial_state.dtype == torch.float32
    frozen = disable_flag(disable_state_update, frozen_if_none=fp32_pool and T > 1)
    if T == 1 and intermediate_states_buffer is not None:
        raise ValueError("intermediate_states_buffer: supported only for T > 1 (use gated_delta_rule_mtp)")
    if T == 1 and frozen:
        raise ValueError("disable_state_update: supported only for T > 1 (use gated_delta_rule_mtp)")
    return frozen, output is None or T == 1


def _no_recovery(accepted_steps, recovery_steps, disable_output) -> None:
    """ValueError if a state-recovery argument is set beside ``cache_replayssm`` (the caching verify writes no state
    and its outputs are the point)."""
    if accepted_steps is not None or (not isinstance(recovery_steps, int) or recovery_steps) or (
            not isinstance(disable_output, int) or disable_output):
        raise ValueError("accepted_steps, recovery_steps, disable_output: not with cache_replayssm")


def _check_discarded_output(q, v, output) -> None:
    """A caller's ``output`` that ``disable_output`` leaves unwritten is still checked as the kernel would check it."""
    if output is not None and isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() == 4 \
            and v.dim() == 4:
        _v.given_output(output, (q.shape[0], q.shape[1], v.shape[2], v.shape[3]), "[B, T, HV, V]", OUT_DTYPES,
                        q.device)


def pool_args(state, initial_state, initial_state_indices, output_state_indices):
    """The pretranspose function's argument combinations -> ``(pool, read, write, direct)``: a direct
    state, or a pool with its read (and optional write) indices; ValueError for any other mix."""
    if initial_state is not None or initial_state_indices is not None:
        if initial_state is None or initial_state_indices is None:
            raise ValueError("initial_state and initial_state_indices: must be passed together (pool mode)")
        if state is not None and state is not initial_state:
            raise ValueError("state: pass None in pool mode (the pool is initial_state)")
        return initial_state, initial_state_indices, output_state_indices, False
    if output_state_indices is not None:
        raise ValueError("output_state_indices: needs pool mode (initial_state + initial_state_indices)")
    if state is None:
        raise ValueError("state: expected the direct state [B, HV, V, K], or pass initial_state + initial_state_indices")
    return state, None, None, True


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GDN decode with the state in K-major layout ``[B, HV, K, V]`` (fp32/bf16), updated in place.

    Same arguments and semantics as :func:`gated_delta_rule_decode_pretranspose` without the pool
    arguments; T may be 1..16. ``backend``: ``"auto"`` / ``"flashinfer"``; ``"cake_gdn"``:
    NotImplementedError. Returns ``(output, state)``.
    """
    check_backend(backend, BACKENDS_DECODE)
    if state is None:
        raise ValueError("state: expected the direct state [B, HV, K, V], got None")
    out = run("kmajor", q, k, v, A_log, a, dt_bias, b, state, None, None, scale, output, None, None, True,
              use_qk_l2norm, direct=True)
    return out, state


def _replay_caches(cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta):
    """FlashInfer 0.7.2's ReplaySSM arguments of ``gated_delta_rule_mtp`` -> the four caches (rawv, rawk, g, beta),
    or None when caching is off (one-line errors for a non-bool flag, a missing cache, caches without the flag)."""
    if cache_replayssm is not None and (isinstance(cache_replayssm, float) or not isinstance(cache_replayssm, (bool, int))):
        raise TypeError(f"cache_replayssm: expected a bool, got {type(cache_replayssm).__name__}")
    named = (("replayssm_rawv", replayssm_rawv), ("replayssm_rawk", replayssm_rawk), ("replayssm_g", replayssm_g),
             ("replayssm_beta", replayssm_beta))
    if not cache_replayssm:
        given = [n for n, x in named if x is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: given without cache_replayssm=True")
        return None
    missing = [n for n, x in named if x is None]
    if missing:
        raise ValueError(f"{', '.join(missing)}: required with cache_replayssm=True")
    return tuple(x for _, x in named)


def _replay_verify_call(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
                        intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
                        output_state_indices, caches) -> Tuple[tuple, dict]:
    """``gated_delta_rule_mtp(cache_replayssm=True)`` (FlashInfer's caching verify) as an engine step: FlashInfer's
    contract is checked here (the pool frozen, no per-token state buffer or scatter, every tensor's base address
    16-byte aligned, ``output_state_indices`` checked and unused: the verify writes no slot) and the step's
    ``(args, kwargs)`` are returned; the caller runs them through its engine step (the eager
    :func:`gdnjit.gdn_engine.engine_step`, or the torch op), whose own checks cover everything else."""
    if not disable_flag(disable_state_update, frozen_if_none=True):
        raise ValueError("disable_state_update: must be true with cache_replayssm (the verify leaves the checkpoint "
                         "for the commit to advance)")
    for name, x in (("intermediate_states_buffer", intermediate_states_buffer), ("ssm_state_indices", ssm_state_indices)):
        if x is not None:
            raise ValueError(f"{name}: not with cache_replayssm (the caches replace the per-token states)")
    T = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else 1
    for name, x in zip(("replayssm_rawv", "replayssm_rawk", "replayssm_g", "replayssm_beta"), caches):
        if isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[2] != T:  # FlashInfer's layout: T tokens per slot
            raise ValueError(f"{name}: expected T={T} tokens per slot and head (dim 2, FlashInfer's layout), got shape "
                             f"{tuple(x.shape)}")
    named = (("q", q), ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias),
             ("initial_state", initial_state), ("initial_state_indices", initial_state_indices),
             ("output_state_indices", output_state_indices), ("output", output), ("replayssm_rawv", caches[0]),
             ("replayssm_rawk", caches[1]), ("replayssm_g", caches[2]), ("replayssm_beta", caches[3]))
    # (a traced call has no addresses: there the engine step's own checks of q, k, the state and the caches remain)
    for name, x in () if torch.compiler.is_compiling() else named:
        if isinstance(x, torch.Tensor) and x.data_ptr() % 16:
            raise ValueError(f"{name}: cache_replayssm needs a 16-byte aligned base address (FlashInfer's contract), "
                             f"got {hex(x.data_ptr())}")
    if output_state_indices is not None and isinstance(initial_state_indices, torch.Tensor):
        check_indices("output_state_indices", output_state_indices, initial_state_indices.shape[0],
                      initial_state_indices.device, like=initial_state_indices)
    return ((q, k, v, A_log, a, dt_bias, b, initial_state),
            dict(T=T, read_idx=initial_state_indices, update=False, scale=scale, l2norm=use_qk_l2norm, output=output,
                 replay_cache=caches, zero_padding=output is None))


def gated_delta_rule_mtp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: Optional[bool] = None,
    use_qk_l2norm: bool = True,
    output_state_indices: Optional[torch.Tensor] = None,
    cache_replayssm: bool = False,
    replayssm_rawv: Optional[torch.Tensor] = None,
    replayssm_rawk: Optional[torch.Tensor] = None,
    replayssm_g: Optional[torch.Tensor] = None,
    replayssm_beta: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None,
    recovery_steps: int = 0,
    disable_output: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Multi-token GDN step (T = 1..16, speculative verify) over a K-last state pool.

    Args (beyond :func:`gated_delta_rule_decode_pretranspose`'s):
        initial_state: ``[pool_size, HV, V, K]`` fp32/bf16 pool (page-strided allowed).
        initial_state_indices: ``[B]`` int32/int64 read slots; negative = padding row: nothing read or
            written, and its output rows are left as they were in a given ``output`` (zeros in an
            allocated one), as in FlashInfer.
        intermediate_states_buffer: optional ``[B_buf >= B, cache_steps >= T, HV, V, K]`` fp32/bf16,
            contiguous; row n, step t receives the state after token t (indexed by batch row).
        ssm_state_indices: optional ``[B, T]`` int32/int64: the state after token t goes to pool slot
            ``ssm_state_indices[n, t]`` (negative: skipped) and the final writeback is skipped.
            Not with ``intermediate_states_buffer``, ``disable_state_update`` or ``output_state_indices``.
        disable_state_update: a bool or an int (its truth value): true leaves the pool untouched (verify mode;
            roll back from the buffer). None (the default, as in FlashInfer 0.7.2): True, with a one-time
            FutureWarning.
        output_state_indices: ``[B]`` write slots (split pool); negative skips the writeback.
        cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta: FlashInfer 0.7.2's
            ReplaySSM cache: with ``cache_replayssm=True`` each token's raw k ``[pool, H, T, K]``, v ``[pool, HV, T,
            V]`` (bf16; fp16 inputs rounded to bf16, as FlashInfer), log decay g and beta ``[pool, HV, T]`` (fp32)
            are stored at the request's read slot, for :func:`gdnjit.replay.gated_delta_rule_replayssm_commit`
            (contiguous caches). FlashInfer's contract: ``disable_state_update`` true, no
            ``intermediate_states_buffer`` or ``ssm_state_indices``, every tensor's base address 16-byte aligned
            (ValueError otherwise); ``output_state_indices`` is checked and unused (nothing is written).
        accepted_steps, recovery_steps, disable_output: the state-recovery arguments of FlashInfer 0.7.2's bf16-state
            module (any state dtype here; :mod:`gdnjit.recovery`). ``accepted_steps [B]`` int32/int64 in 0..T-1: with
            the pool updated, the state after token ``accepted_steps[n]`` is the request's only pool write (to its
            write slot; with ``ssm_state_indices``, the slots of tokens 0..``accepted_steps[n]`` only).
            ``recovery_steps`` R in 0..T: the state after token R - 1 is every request's only pool write (R > 0 needs
            the state updated, no buffer, no ``ssm_state_indices``). ``disable_output`` (bool or int): the caller's
            ``output`` is not written (the kernel writes a scratch tensor, which is returned when ``output`` is None).
            Outputs are those of the same state chain for every token. Not with ``cache_replayssm``.

    Returns:
        ``(output [B, T, HV, V], initial_state)``.
    """
    plan = plan_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
                    intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
                    output_state_indices, cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta,
                    accepted_steps, recovery_steps, disable_output)
    if plan.verify is not None:
        args, kwargs = plan.verify
        return engine_step(*args, **kwargs), initial_state
    out = run("klast", q, k, v, A_log, a, dt_bias, b, initial_state, initial_state_indices, plan.write_idx, scale,
              None if plan.scratch_output else output, intermediate_states_buffer, plan.ssm, not plan.frozen,
              use_qk_l2norm, direct=False, zero_padding=plan.zero_padding, write_once=plan.write_once)
    return (output if plan.scratch_output and output is not None else out), initial_state


class MtpPlan(NamedTuple):
    """How one ``gated_delta_rule_mtp`` call runs, decided once for both front doors (this module's function and
    :mod:`gdnjit.torch_ops`' wrapper): FlashInfer's ReplaySSM verify as an engine step (``verify``: its ``(args,
    kwargs)``), or the multi-token kernel with these flags and write targets."""

    verify: Optional[tuple]
    frozen: bool = True
    zero_padding: bool = True  # padding rows' outputs zeroed (an output allocated here, or a scratch one)
    write_idx: Optional[torch.Tensor] = None
    ssm: Optional[torch.Tensor] = None  # per-token write slots: the caller's, or the state-recovery write map
    write_once: bool = False
    scratch_output: bool = False  # disable_output: the kernel writes a scratch tensor, never the caller's output


def plan_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
             intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm, output_state_indices,
             cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta, accepted_steps,
             recovery_steps, disable_output) -> MtpPlan:
    """:class:`MtpPlan` of a ``gated_delta_rule_mtp`` call (its arguments, as there): FlashInfer 0.7.2's
    conventions (None freezes the pool, a caller's padding rows kept), its ReplaySSM contract and its state-recovery
    arguments (:func:`gdnjit.recovery.plan`), checked with one-line errors; the kernel's own checks come after."""
    caches = _replay_caches(cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta)
    if caches is not None:
        _no_recovery(accepted_steps, recovery_steps, disable_output)
        return MtpPlan(_replay_verify_call(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale,
                                           output, intermediate_states_buffer, ssm_state_indices, disable_state_update,
                                           use_qk_l2norm, output_state_indices, caches))
    frozen = disable_flag(disable_state_update, frozen_if_none=True)
    rec = _recovery.plan(q, initial_state_indices, output_state_indices, ssm_state_indices, intermediate_states_buffer,
                         frozen, accepted_steps, recovery_steps, disable_output)
    if rec.scratch_output:
        _check_discarded_output(q, v, output)
    return MtpPlan(None, frozen, output is None or rec.scratch_output, rec.write_idx, rec.ssm, rec.write_once,
                   rec.scratch_output)


def example_call(params: dict, facts: dict, device) -> Tuple[object, tuple]:
    """Random inputs for one problem of the ``gdn`` spec (``gdnjit tune`` times variants on them):
    the named call and the tensors it points into (keep them alive while it runs)."""
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32,
          "int64": torch.int64}
    B, H, HV = facts["B"], facts["H"], facts["HV"]
    K, V, T = params["K"], params["V"], params["T"]
    trailing = (HV, V, K) if params["layout"] == "klast" else (HV, K, V)
    slots = B * (T + 1) if params["ssm_idx_dtype"] != "none" else (2 * B if not params["same_pool"] else B)
    ind = dt[params["in_dtype"]]
    q, k = (torch.randn(B, T, H, K, device=device, dtype=ind) for _ in range(2))
    v = torch.randn(B, T, HV, V, device=device, dtype=ind)
    a, b = (torch.randn(B, T, HV, device=device, dtype=ind) for _ in range(2))
    A_log = torch.rand(HV, device=device)
    dt_bias = torch.randn(HV, device=device).to(dt[params["dtb_dtype"]])
    pool = torch.randn(slots, *trailing, device=device).to(dt[params["state_dtype"]])
    if params["slot_strided"]:  # every other head of a pool twice as wide (FlashInfer's non-contiguous pool test)
        pool = torch.randn(slots, 2 * HV, *trailing[1:], device=device).to(dt[params["state_dtype"]])[:, ::2]
    read = write = inter = ssm = None
    if params["pool"]:
        idt = dt[params["idx_dtype"]]
        read = torch.randperm(B, device=device).to(idt)
        if not params["same_pool"]:
            write = (B + torch.randperm(B, device=device)).to(idt)
        if params["ssm_idx_dtype"] != "none":
            ssm = (B + torch.randperm(B * T, device=device)).reshape(B, T).to(dt[params["ssm_idx_dtype"]])
    if params["inter_dtype"] != "none":
        inter = torch.empty(B, T, *trailing, device=device, dtype=dt[params["inter_dtype"]])
    out = torch.empty(B, T, HV, V, device=device, dtype=dt[params["out_dtype"]])
    _, call = prepare(params["layout"], q, k, v, A_log, a, dt_bias, b, pool, read, write, None, out, inter, ssm,
                      params["update"], params["l2norm"], not params["pool"])
    return call, (q, k, v, a, b, A_log, dt_bias, pool, read, write, inter, ssm, out)
