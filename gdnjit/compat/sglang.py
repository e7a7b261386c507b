"""SGLang's GDN kernel's signature and semantics, on gdnjit's kernels (SGLang 0.5.23,
``sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py``; earlier releases:
``python/sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py``).

Conventions reproduced: q/k/v ``[B, T, ..]`` or varlen ``[1, total, ..]`` with ``cu_seqlens``; a / b ``[total, HV]``
or ``[B, T, HV]``; one slot per request (``initial_state_indices`` ``[N]``; a negative slot is padding: the request
runs from a zero state, its outputs and buffer rows are written, the pool is not); ``disable_state_update``;
``intermediate_states_buffer`` ``[rows, steps, HV, V, K]`` with ``intermediate_state_indices`` (the buffer row of
each request, negative: not cached; None: the batch row); EAGLE tree verification with ``retrieve_parent_token``
``[N, T]`` (token t >= 1 starts from its parent's state as cached in the buffer); the ReplaySSM ring write
(``cache_ring=True`` with per-layer rings ``replayssm_rawv [slots, HV, L, V]``, ``replayssm_rawk [slots, H, L, K]``
(bf16), ``replayssm_g`` / ``replayssm_beta [slots, HV, L]`` (fp32), L >= the draft length: token t of a request
stores its raw v, k (before the l2norm), log decay and beta at position t of its slot's rings; padding requests and
tokens t >= L store nothing), which :func:`gdnjit.gated_delta_rule_replayssm_commit` replays. Returns the output only.
Also SGLang's default CUDA decode, ``fused_recurrent_gated_delta_rule_packed_decode`` (vLLM's signature; a slot < 0
is padding, and beta is rounded to b's dtype before use, as SGLang's copy of the kernel does).
Differences (docs/api.md, "SGLang compat"): a tree without a buffer is refused (SGLang ignores the tree then), as is
a tree with the ring (SGLang asserts a linear chain there); KDA, ``lower_bound`` and ``match_cutedsl_decode`` are not
provided.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..gdn import MAX_T
from . import common as _c
from .launch import step as _step

__all__ = ["fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule_packed_decode"]


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, softplus_beta: float, softplus_threshold: float,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, initial_state_source: Optional[torch.Tensor],
    initial_state_indices: Optional[torch.Tensor], scale: Optional[float] = None, use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None, is_kda: bool = False, lower_bound: Optional[float] = None,
    disable_state_update: bool = False, intermediate_states_buffer: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None, cache_steps: Optional[int] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None, cache_ring: bool = False,
    replayssm_rawv: Optional[torch.Tensor] = None, replayssm_rawk: Optional[torch.Tensor] = None,
    replayssm_g: Optional[torch.Tensor] = None, replayssm_beta: Optional[torch.Tensor] = None,
    match_cutedsl_decode: bool = False,
) -> torch.Tensor:
    """SGLang's fused gate + gated delta rule step (decode, or target verify with a per-step state buffer and
    optionally an EAGLE tree). Returns o ``[*q.shape[:2], HV, V]`` of q's dtype."""
    if is_kda:
        raise NotImplementedError("is_kda: KDA (per-channel gates) is not provided by gdnjit")
    if lower_bound is not None:
        raise NotImplementedError("lower_bound: the bounded-decay gate variant is not provided by gdnjit")
    rings = (replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta)
    if not isinstance(cache_ring, bool):
        raise TypeError(f"cache_ring: expected a bool, got {type(cache_ring).__name__}")
    if cache_ring and any(x is None for x in rings):
        raise ValueError("cache_ring: needs replayssm_rawv, replayssm_rawk, replayssm_g and replayssm_beta")
    if not cache_ring and any(x is not None for x in rings):
        raise ValueError("replayssm_*: given without cache_ring=True (SGLang writes the rings only then)")
    if match_cutedsl_decode:
        raise NotImplementedError("match_cutedsl_decode: FlashInfer's KDA decode arithmetic is not provided by gdnjit")
    if not isinstance(disable_state_update, (bool, int)) or isinstance(disable_state_update, float):
        raise TypeError(f"disable_state_update: expected a bool, got {type(disable_state_update).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError("q, v: expected 4-D tensors [B, T, H, K] / [B, T, HV, V] (varlen: [1, total, .., ..])")
    lead, HV, V, K = tuple(q.shape[:2]), v.shape[2], v.shape[3], q.shape[3]
    a = _c.gate_view("a", a, lead, q)
    b = _c.gate_view("b", b, lead, q)
    cu = _c.offsets("cu_seqlens", cu_seqlens)
    varlen = cu is not None
    N = (cu.shape[0] - 1) if varlen else lead[0]
    buf = intermediate_states_buffer
    if buf is not None:
        if not isinstance(buf, torch.Tensor) or buf.dim() != 5:
            raise ValueError("intermediate_states_buffer: expected a 5-D tensor [rows, steps, HV, V, K]")
        T = buf.shape[1] if varlen else lead[1]
    elif varlen:
        if cache_steps is not None and (isinstance(cache_steps, bool) or not isinstance(cache_steps, int)):
            raise TypeError(f"cache_steps: expected an int or None, got {type(cache_steps).__name__}")
        T = cache_steps if cache_steps is not None else _c.expected_tokens(lead[1], N)
    else:
        T = lead[1]
    if not 1 <= T <= MAX_T:
        raise ValueError(f"tokens per request: expected 1..{MAX_T}, got {T} (from "
                         f"{'the buffer steps' if buf is not None else 'cache_steps' if cache_steps else 'q'})")
    inter_idx = None
    if buf is not None:
        idx_dtype = initial_state_indices.dtype if isinstance(initial_state_indices, torch.Tensor) else torch.int32
        if intermediate_state_indices is None:
            inter_idx = torch.arange(N, dtype=idx_dtype, device=q.device)
        elif isinstance(intermediate_state_indices, torch.Tensor) and intermediate_state_indices.dtype != idx_dtype:
            inter_idx = intermediate_state_indices.to(idx_dtype)
        else:
            inter_idx = intermediate_state_indices
    elif intermediate_state_indices is not None:
        raise ValueError("intermediate_state_indices: needs intermediate_states_buffer")
    parent = _c.int32("retrieve_parent_token", retrieve_parent_token)
    if parent is not None and cache_ring:
        raise ValueError("retrieve_parent_token: not with cache_ring (SGLang's ring verify takes a linear draft chain)")
    if parent is not None and buf is None:
        raise ValueError("retrieve_parent_token: tree verification needs intermediate_states_buffer (SGLang ignores "
                         "the tree then; gdnjit refuses rather than verify a chain)")
    pool, read = initial_state_source, initial_state_indices
    update = not bool(disable_state_update)
    if pool is None:  # SGLang: every request from a zero state, nothing written to a pool
        pool = torch.empty((1, HV, V, K), dtype=torch.float32, device=q.device)
        read = torch.full((N,), -1, dtype=torch.int32, device=q.device)
        update = False
    elif read is None:
        raise ValueError("initial_state_indices: required with initial_state_source")
    else:
        _c.state_pool("initial_state_source", pool)
    return _step(q, k, v, A_log, a, dt_bias, b, pool, T=T, read_idx=read, cu_seqlens=cu, inter=buf,
                 inter_idx=inter_idx, parent=parent, bounded=buf is not None or cache_steps is not None, update=update,
                 null_slot="negative", padding="zero_state",
                 gates="raw", scale=_c.scale_of(scale, K), l2norm=use_qk_l2norm_in_kernel,
                 softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                 replay_cache=rings if cache_ring else None)


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """SGLang's default CUDA decode (``sglang/kernels/ops/attention/fla/fused_recurrent.py``; the signature of vLLM's
    :func:`gdnjit.compat.vllm.fused_recurrent_gated_delta_rule_packed_decode`): one token per request, q / k / v
    from the conv output's packed ``[q | k | v]`` rows, ``out [B, 1, HV, V]`` written (zeros for a request whose slot
    is < 0, SGLang's padding; slot 0 is a real slot), the pool updated in place; beta = sigmoid(b) rounded to b's
    dtype before use, as SGLang's kernel does. Returns ``(out, initial_state)``."""
    return _c.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                            use_qk_l2norm_in_kernel, "negative", round_beta=True)
