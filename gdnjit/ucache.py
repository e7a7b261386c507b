"""FlashInfer 0.7.2.post1's u-cache speculative-decoding calls over gdnjit's lazy-state kernel (docs/design.md
section 11): ``flashinfer.gdn_kernels.gated_delta_rule_mtp_ucache`` (verify only) and
``gated_delta_rule_mtp_ucache_flush`` (verify, and fold the rows whose window is full), same signatures and semantics.

Per batch row n (slot ``initial_state_indices[n]``), P = ``hist_len[n]`` committed ring rows starting at ring row
``cache_base[n]`` (0 without ``cache_base``, and always 0 for the verify-only call's flat 16-row ring):

- the T draft tokens' outputs are computed from the checkpoint and the P rows; their rows (normalised k, u, and the
  cumulative log decay G) are appended at ring rows ``(base + P + t) mod rows``, past the window;
- the flush call folds rows with ``hist_len >= flush_min`` (default ``16 - T + 1``): the slot's state becomes the state
  after its P rows, and the appended rows' G restarts from that state. The caller commits cursors (a folded row:
  ``base <- (base + P) mod 32``, ``hist_len <- accepted``; else ``hist_len <- P + accepted``), or passes
  ``restart_hist_on_flush=True`` and the call slides the base and zeroes ``hist_len`` of the folded rows itself.

Where FlashInfer stops gdnjit goes on: T 1..16, K and V in {64, 128, 256}, fp32 / bf16 / fp16 states and rings,
bf16 / fp16 inputs, dtypes taken from the tensors (FlashInfer fixes them by environment variables at import, bf16 by
default, K = V = 128, T in {4, 8}); any softplus_beta / threshold, use_qk_l2norm_in_kernel False, int64 indices.
Divergences (docs/api.md): A_log and dt_bias are read in their own dtype (FlashInfer rounds both to bf16); padding
rows (a negative slot) of an output gdnjit allocates are zeros (FlashInfer's are uninitialised); an illegal cursor
is a :class:`~gdnjit.errors.ContractError` (a ValueError and an AssertionError).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import lazy as _lazy
from . import validate as _v
from .call_mode import CallMode
from .errors import ContractError
from .gdn_core import launch_device, uses_pdl

WINDOW = 16        # FlashInfer's window (W_RING): at most 16 committed rows
RING_SLOTS = 32    # the flush call's ring rows
FLAT_RING = 16     # the verify-only call's ring rows
RING_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

STEP = CallMode(_lazy.SPEC, "FlashInfer u-cache", ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state", "idx", "out",
                                                   "k_ring", "u_ring", "g_ring", "hist", "base", "scratch"))


def _unsupported(name: str, output_state_indices, intermediate_states_buffer, accepted_steps, ssm_state_indices,
                 disable_output, recovery_steps) -> None:
    """FlashInfer's arguments its u-cache calls reject (NotImplementedError there and here)."""
    for arg, value in (("output_state_indices", output_state_indices),
                       ("intermediate_states_buffer", intermediate_states_buffer),
                       ("accepted_steps", accepted_steps), ("ssm_state_indices", ssm_state_indices)):
        if value is not None:
            raise NotImplementedError(f"{name}: {arg} is not supported by the u-cache calls (pass None)")
    if disable_output:
        raise NotImplementedError(f"{name}: disable_output=True is not supported (the call always writes outputs)")
    if isinstance(recovery_steps, bool) or not isinstance(recovery_steps, int) or recovery_steps != 0:
        raise NotImplementedError(f"{name}: recovery_steps must be 0, got {recovery_steps!r}")


def _run(name: str, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
         initial_state_indices, use_qk_l2norm_in_kernel, scale, output, k_cache, u_cache, g_cache, hist_len,
         cache_base, flush_min, rows: int, fold: bool):
    """Every check, then the launch; returns (output, flush_min)."""
    for arg, value in (("q", q), ("k", k), ("v", v), ("b", b), ("initial_state_source", initial_state_source),
                       ("k_cache", k_cache), ("u_cache", u_cache), ("g_cache", g_cache), ("hist_len", hist_len)):
        if value is None:
            raise ValueError(f"{name}: {arg} is required")
    state = initial_state_source
    try:
        slots, HV, V, K = _lazy.check_state(state)
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace("state:", "initial_state_source:", 1)) from None
    device = state.device
    _v.tensor("q", q, 4)
    B, T = q.shape[0], q.shape[1]
    use_l2 = _v.truthy("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    T_, H = _lazy.check_inputs(q, k, v, a, b, A_log, dt_bias, B, HV, K, V, device)
    _lazy.check_rings(("k_cache", "u_cache", "g_cache"), k_cache, u_cache, g_cache, slots, H, HV, K, V, rows, device,
                      RING_DTYPES)
    if initial_state_indices is None:
        if B > slots:
            raise ValueError(f"initial_state_indices: required when B={B} exceeds the pool's {slots} slots")
        initial_state_indices = torch.arange(B, dtype=torch.int32, device=device)
    _v.tensor("initial_state_indices", initial_state_indices, 1)
    _v.index_tensor("initial_state_indices", initial_state_indices, B, device)
    for arg, x in (("hist_len", hist_len), ("cache_base", cache_base)):
        if x is not None:
            _v.tensor(arg, x, 1)
            _v.dtype_in(arg, x, (torch.int32,))
            _v.same_device(arg, x, device)
            _v.shape_is(arg, x, (B,), f"[B={B}]")
    if fold:
        cap = WINDOW - T + 1
        if flush_min is None:
            flush_min = cap
        if isinstance(flush_min, bool) or not isinstance(flush_min, int) or not 1 <= flush_min <= max(cap, 1):
            raise ContractError(f"flush_min: expected an int in [1, {max(cap, 1)}] for T={T} (16 - T + 1: above it a "
                                f"row could neither append nor fold), got {flush_min!r}")
    elif T > FLAT_RING:
        raise ValueError(f"q: the verify-only call's 16-row ring holds at most 16 tokens, got T={T}")
    scale, beta, threshold = _lazy.gate_values(scale, softplus_beta, softplus_threshold, K)
    zero_pad = output is None
    output = _lazy.step_output(output, q.dtype, B, T, HV, V, device)
    if B == 0:
        return output, flush_min
    hist = hist_len.contiguous()  # read only: a copy of a strided cursor is what the kernel reads
    base = cache_base.contiguous() if cache_base is not None else None
    params = dict(mode="step", cursor="row", fold="auto" if fold else "never", ring=rows, K=K, V=V, T=T,
                  in_dtype=_v.FLOAT_NAMES[q.dtype], out_dtype=_v.FLOAT_NAMES[output.dtype],
                  state_dtype=_v.FLOAT_NAMES[state.dtype], ring_dtype=_v.FLOAT_NAMES[k_cache.dtype],
                  alog_dtype=_v.FLOAT_NAMES[A_log.dtype], dtb_dtype=_v.FLOAT_NAMES[dt_bias.dtype],
                  idx_dtype=_v.INDEX_NAMES[initial_state_indices.dtype], l2norm=use_l2, zero_pad=zero_pad)
    args = dict(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), a=a.data_ptr(), b=b.data_ptr(),
                A_log=A_log.data_ptr(), dt_bias=dt_bias.data_ptr(), state=state.data_ptr(),
                idx=initial_state_indices.data_ptr(), out=output.data_ptr(), k_ring=k_cache.data_ptr(),
                u_ring=u_cache.data_ptr(), g_ring=g_cache.data_ptr(), hist=hist.data_ptr(),
                base=0 if base is None else base.data_ptr(), **_lazy.token_args(q, k, v, a, b, output),
                **_lazy.pool_args(state, k_cache, u_cache, g_cache), scale=scale, softplus_beta=beta,
                softplus_threshold=threshold, flush_min=flush_min if fold else 0, B=B, H=H, HV=HV)
    dev = launch_device(device, True)
    bounds, dev, nbytes = _lazy.bind(STEP.call(params, dict(B=B, H=H, HV=HV), args, dev, pdl=uses_pdl(dev)))
    scratch = _lazy.scratch_for(nbytes, device)
    _lazy.run(dev, bounds, STEP.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(),
                                     A_log.data_ptr(), dt_bias.data_ptr(), state.data_ptr(),
                                     initial_state_indices.data_ptr(), output.data_ptr(), k_cache.data_ptr(),
                                     u_cache.data_ptr(), g_cache.data_ptr(), hist.data_ptr(), _lazy.address(base),
                                     _lazy.address(scratch)))
    return output, flush_min


def gated_delta_rule_mtp_ucache(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    q: Optional[torch.Tensor] = None,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    b: Optional[torch.Tensor] = None,
    initial_state_source: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    disable_output: bool = False,
    recovery_steps: int = 0,
    k_cache: Optional[torch.Tensor] = None,
    u_cache: Optional[torch.Tensor] = None,
    g_cache: Optional[torch.Tensor] = None,
    hist_len: Optional[torch.Tensor] = None,
    use_pdl: bool = False,
) -> torch.Tensor:
    """FlashInfer's verify-only u-cache call: the T draft outputs from the checkpoint ``initial_state_source [pool,
    HV, V, K]`` (never written) and the first ``hist_len[n]`` rows of the slot's flat 16-row ring (``k_cache [pool,
    H, 16, K]``, ``u_cache [pool, HV, 16, V]``, ``g_cache [pool, HV, 16]`` fp32), appending the T new rows at rows
    ``hist_len[n] ..``; the caller keeps ``hist_len + T <= 16`` and rewinds with ``hist_len = P + accepted``.
    q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, a, b ``[B, T, HV]``; A_log, dt_bias ``[HV]``. Returns ``output
    [B, T, HV, V]`` (q's dtype unless given). ``disable_state_update`` and ``use_pdl`` are accepted and change
    nothing (the state is never written here; PDL follows ``GDNJIT_PDL``). See the module docstring."""
    name = "gated_delta_rule_mtp_ucache"
    _unsupported(name, output_state_indices, intermediate_states_buffer, accepted_steps, ssm_state_indices,
                 disable_output, recovery_steps)
    _v.truthy("disable_state_update", disable_state_update)
    out, _ = _run(name, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                  initial_state_indices, use_qk_l2norm_in_kernel, scale, output, k_cache, u_cache, g_cache, hist_len,
                  None, None, FLAT_RING, fold=False)
    return out


def gated_delta_rule_mtp_ucache_flush(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    q: Optional[torch.Tensor] = None,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    b: Optional[torch.Tensor] = None,
    initial_state_source: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None,
    ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None,
    disable_output: bool = False,
    recovery_steps: int = 0,
    k_cache: Optional[torch.Tensor] = None,
    u_cache: Optional[torch.Tensor] = None,
    g_cache: Optional[torch.Tensor] = None,
    hist_len: Optional[torch.Tensor] = None,
    cache_base: Optional[torch.Tensor] = None,
    flush_min: Optional[int] = None,
    restart_hist_on_flush: bool = True,
    pdl_trigger: bool = False,
) -> torch.Tensor:
    """FlashInfer's verify+flush u-cache call over a 32-row ring per slot (``k_cache [pool, H, 32, K]``, ``u_cache
    [pool, HV, 32, V]``, ``g_cache [pool, HV, 32]`` fp32): the window of row n is ``hist_len[n]`` (0..16) rows from
    ``cache_base[n]`` (0..31; None: 0). Rows with ``hist_len >= flush_min`` (default ``16 - T + 1``) also fold their
    window into the slot's state. The T new rows go past the window. ``restart_hist_on_flush=True`` (the default)
    then commits the folded rows' cursors in place (``cache_base`` required, contiguous ``hist_len`` and
    ``cache_base``; outside graph capture it also checks their ranges, a host sync); False leaves the commit to the
    caller. Returns ``output [B, T, HV, V]``. ``disable_state_update`` and ``pdl_trigger`` are accepted and change
    nothing. See the module docstring."""
    name = "gated_delta_rule_mtp_ucache_flush"
    _unsupported(name, output_state_indices, intermediate_states_buffer, accepted_steps, ssm_state_indices,
                 disable_output, recovery_steps)
    _v.truthy("disable_state_update", disable_state_update)
    restart = _v.truthy("restart_hist_on_flush", restart_hist_on_flush)
    if restart:
        if cache_base is None:
            raise ValueError("cache_base: restart_hist_on_flush=True commits the cursors in place and needs a "
                             "caller-owned cache_base (got None); keep an int32 [B] tensor (zeros at first), or pass "
                             "restart_hist_on_flush=False and commit the cursors yourself")
        for arg, x in (("hist_len", hist_len), ("cache_base", cache_base)):
            if isinstance(x, torch.Tensor) and not x.is_contiguous():
                raise ContractError(f"{arg}: restart_hist_on_flush=True commits it in place: expected a contiguous "
                                    f"tensor, got strides {x.stride()}")
        # (the ranges of int32 CUDA cursors; any other hist_len / cache_base is refused by the checks below)
        if isinstance(hist_len, torch.Tensor) and isinstance(cache_base, torch.Tensor) and hist_len.numel() and \
                hist_len.is_cuda and cache_base.is_cuda and hist_len.dtype == cache_base.dtype == torch.int32 and \
                not torch.cuda.is_current_stream_capturing():
            lo, hi = (int(x) for x in hist_len.aminmax())
            if lo < 0 or hi > WINDOW:
                raise ContractError(f"hist_len out of legal range [0, {WINDOW}]: min={lo} max={hi}")
            lo, hi = (int(x) for x in cache_base.aminmax())
            if lo < 0 or hi >= RING_SLOTS:
                raise ContractError(f"cache_base out of legal range [0, {RING_SLOTS}): min={lo} max={hi}")
    out, flush_min = _run(name, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                          initial_state_indices, use_qk_l2norm_in_kernel, scale, output, k_cache, u_cache, g_cache,
                          hist_len, cache_base, flush_min, RING_SLOTS, fold=True)
    if restart and hist_len.numel():
        folded = hist_len >= flush_min
        cache_base.copy_(torch.where(folded, (cache_base + hist_len) & (RING_SLOTS - 1), cache_base))
        hist_len.masked_fill_(folded, 0)
    return out
