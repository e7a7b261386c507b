"""FlashInfer 0.7.2's ReplaySSM commit on gdnjit's kernels: fold the accepted prefix of each request's cached draft
tokens into its checkpoint state (speculative decoding without storing T states).

Verify (:func:`gdnjit.gated_delta_rule_mtp` with ``cache_replayssm=True``) caches, per pool slot, each draft
token's raw k, v, log decay g and beta; after acceptance this commit replays the first ``accept_lens[i]`` of them
into slot ``state_indices[i]`` of every layer's checkpoint, the only state write (math:
:mod:`gdnjit.reference.replay`). The kernel is the ``gdn`` spec with ``replay`` set, in its recurrent form or (bf16
caches, K = 128, T 2..8, no track; by the rules) its tc form: the cached tokens are its inputs (rows = slots), no q,
no outputs. This module validates and builds the named call.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import validate as _v
from .call_mode import CallMode
from .gdn_core import MAX_T, SPEC, STATE_DTYPES, SUPPORTED_DIMS, launch_device, uses_pdl
from .gdn_core import ptr as _ptr
from .gdn_core import signature as _sig
from .runner import RUNNER, launch_on, remember

__all__ = ["gated_delta_rule_replayssm_commit", "prepare", "COMMIT"]

# The commit: the cached tokens are the kernel's token inputs (rows = slots). The raw k cache is passed as q too:
# the kernel normalises a token's q and k alike, and the commit only needs the k it writes into the state.
COMMIT = CallMode(SPEC, "replay commit", ("q", "k", "v", "a", "b", "state", "read_idx", "acc", "trk_idx", "trk_step"))
_BACKENDS = ("auto", "simt", "tcgen05")
_memo: dict = RUNNER.memo()  # metadata signature -> (BoundLaunch, device)
_MEMO_MAX = 256


def gated_delta_rule_replayssm_commit(
    checkpoint_state: torch.Tensor,
    rawv_cache: torch.Tensor,
    rawk_cache: torch.Tensor,
    g_cache: torch.Tensor,
    beta_cache: torch.Tensor,
    state_indices: torch.Tensor,
    accept_lens: torch.Tensor,
    *,
    track_state_indices: Optional[torch.Tensor] = None,
    track_steps: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    null_block_id: int = -1,
    backend: str = "auto",
) -> None:
    """Replay the accepted prefix of each request's cached tokens into its checkpoint, in place (FlashInfer 0.7.2's
    signature and layouts; any GPU gdnjit runs on, fp32 or bf16 checkpoint, K / V in 64 / 128 / 256, T 1..16).

    Args:
        checkpoint_state: ``[L, slots, HV, V, K]`` fp32 / bf16, contiguous: every layer's checkpoint pool.
        rawv_cache: ``[L, slots, HV, T, V]`` bf16 / fp16; rawk_cache ``[L, slots, H, T, K]`` (the same dtype; k before
            the l2norm); g_cache, beta_cache ``[L, slots, HV, T]`` fp32 (log decay, beta after the sigmoid). Contiguous.
        state_indices: ``[B]`` int32 / int64 slots; a slot ``<= null_block_id`` is skipped.
        accept_lens: ``[B]`` int32 in 0..T: request i replays its first ``accept_lens[i]`` cached tokens (0: nothing).
        track_state_indices, track_steps: optional ``[B]`` (the indices' dtype / int32): also save the state after
            token ``track_steps[i]`` (zero-based, inside the accepted prefix) to slot ``track_state_indices[i]``
            (skipped when that slot is ``<= null_block_id``).
        use_qk_l2norm: normalise the cached k (eps 1e-6 under the square root), as verify did.
        null_block_id: an int >= -1: slots <= it are skipped (-1: negative slots; vLLM's null block: 0).
        backend: "auto" / "simt" run gdnjit's kernel; "tcgen05" (FlashInfer's Blackwell tensor-core commit) is not
            provided (NotImplementedError).

    Every tensor's base address must be 16-byte aligned (FlashInfer's contract; ValueError naming it).
    Values a kernel cannot check without a device read (a slot past the pool, an accept length outside 0..T) stop it
    with a trap. Graph capturable; one launch for all layers and requests.
    """
    check_backend(backend)
    if backend == "tcgen05":  # FlashInfer checks the arguments and the backend's own limits first
        prepare(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
                track_state_indices, track_steps, use_qk_l2norm, null_block_id)
        refuse_tcgen05(rawk_cache.shape[3], use_qk_l2norm, track_steps is not None)
    config = RUNNER.sync()
    tensors = (checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
               track_state_indices, track_steps)
    try:
        ptrs = COMMIT.pack(rawk_cache.data_ptr(), rawk_cache.data_ptr(), rawv_cache.data_ptr(), g_cache.data_ptr(),
                           beta_cache.data_ptr(), checkpoint_state.data_ptr(), state_indices.data_ptr(),
                           accept_lens.data_ptr(), _ptr(track_state_indices), _ptr(track_steps))
        sig = (tuple(_sig(x) for x in tensors), use_qk_l2norm, type(use_qk_l2norm), null_block_id,
               type(null_block_id), any(p & 15 for p in ptrs))  # every base 16-byte aligned (checked by prepare)
        hit = _memo.get(sig)
    except (AttributeError, TypeError, RuntimeError):
        sig = hit = None
    if hit is None:
        call = prepare(*tensors, use_qk_l2norm, null_block_id)
        if call is None:
            return
        bound, dev = RUNNER.bind(call), call.device
        ptrs = COMMIT.pointer_values(call)
        remember(_memo, sig, (bound, dev), config, _MEMO_MAX)
    else:
        bound, dev = hit
    launch_on(dev, bound, ptrs)


def check_backend(backend) -> None:
    """FlashInfer's commit backends: "auto" / "simt" run gdnjit's kernel, "tcgen05" is refused by
    :func:`refuse_tcgen05` after the argument checks; anything else: ValueError."""
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")


def refuse_tcgen05(T: int, use_qk_l2norm: bool, track: bool) -> None:
    """backend="tcgen05": ValueError where FlashInfer's tcgen05 commit refuses the call too (T outside 4..8,
    unnormalised k, a track), else NotImplementedError (FlashInfer's Blackwell kernel is not provided)."""
    if not 4 <= T <= 8 or not use_qk_l2norm or track:
        raise ValueError(f"backend='tcgen05': FlashInfer's tcgen05 commit takes T 4..8 with use_qk_l2norm=True and no "
                         f"track; got T={T}, use_qk_l2norm={use_qk_l2norm}, track={track}")
    raise NotImplementedError("backend='tcgen05': FlashInfer's Blackwell tensor-core commit is not provided by "
                              "gdnjit; use 'auto' or 'simt'")


def _cache(name: str, x, shape: tuple, dtypes, device) -> None:
    _v.dense_buffer(name, x, shape, dtypes, device, "[L, slots, heads, T, dim]" if len(shape) == 5 else "[L, slots, HV, T]",
                    vector=len(shape) == 5)  # g / beta are read one by one


def _vector(name: str, x, B: int, dtypes, device) -> None:
    _v.tensor(name, x, 1)
    _v.dtype_in(name, x, dtypes)
    _v.same_device(name, x, device)
    _v.shape_is(name, x, (B,), f"[B={B}]")
    if B > 1 and x.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous tensor, got stride {x.stride()}")


def prepare(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
            track_state_indices, track_steps, use_qk_l2norm, null_block_id, require_cuda: bool = True):
    """Every check; the named call (None when there is nothing to replay)."""
    (_v.cuda_tensor if require_cuda else _v.tensor)("checkpoint_state", checkpoint_state, 5)
    _v.dtype_in("checkpoint_state", checkpoint_state, STATE_DTYPES)
    device = checkpoint_state.device
    L, S, HV, V, K = checkpoint_state.shape
    if K not in SUPPORTED_DIMS or V not in SUPPORTED_DIMS:
        raise ValueError(f"checkpoint_state: K and V must be in {SUPPORTED_DIMS}, got shape {tuple(checkpoint_state.shape)}")
    if not checkpoint_state.is_contiguous():
        raise ValueError(f"checkpoint_state: expected a contiguous tensor, got strides {checkpoint_state.stride()}")
    _v.aligned("checkpoint_state", checkpoint_state, 16)
    _v.tensor("rawk_cache", rawk_cache, 5)
    H, T = rawk_cache.shape[2], rawk_cache.shape[3]
    if not 1 <= T <= MAX_T:
        raise ValueError(f"rawk_cache: the cached tokens T (dim 3) must be in 1..{MAX_T}, got {T}")
    if H < 1 or HV % H:
        raise ValueError(f"rawk_cache: its heads H={H} must divide HV={HV}")
    _cache("rawk_cache", rawk_cache, (L, S, H, T, K), (torch.bfloat16, torch.float16), device)
    _cache("rawv_cache", rawv_cache, (L, S, HV, T, V), (rawk_cache.dtype,), device)
    _cache("g_cache", g_cache, (L, S, HV, T), (torch.float32,), device)
    _cache("beta_cache", beta_cache, (L, S, HV, T), (torch.float32,), device)
    _v.tensor("state_indices", state_indices, 1)
    B = state_indices.shape[0]
    _vector("state_indices", state_indices, B, _v.INDEX_NAMES, device)
    _vector("accept_lens", accept_lens, B, (torch.int32,), device)
    if (track_state_indices is None) != (track_steps is None):
        raise ValueError("track_state_indices, track_steps: pass both or neither")
    if track_steps is not None:
        _vector("track_state_indices", track_state_indices, B, (state_indices.dtype,), device)
        _vector("track_steps", track_steps, B, (torch.int32,), device)
    for name, x in (("checkpoint_state", checkpoint_state), ("rawv_cache", rawv_cache), ("rawk_cache", rawk_cache),
                    ("g_cache", g_cache), ("beta_cache", beta_cache), ("state_indices", state_indices),
                    ("accept_lens", accept_lens), ("track_state_indices", track_state_indices),
                    ("track_steps", track_steps)):
        if x is not None and x.data_ptr() % 16:
            raise ValueError(f"{name}: the commit needs a 16-byte aligned base address (FlashInfer's contract), got "
                             f"{hex(x.data_ptr())}")
    use_qk_l2norm = _v.boolean("use_qk_l2norm", use_qk_l2norm)
    _v.null_block("null_block_id", null_block_id)
    if B == 0 or L == 0:
        return None
    params = dict(K=K, V=V, T=T, in_dtype=_v.FLOAT_NAMES[rawk_cache.dtype],
                  out_dtype=_v.FLOAT_NAMES[rawk_cache.dtype], state_dtype=_v.FLOAT_NAMES[checkpoint_state.dtype],
                  dtb_dtype="fp32", pool=True, idx_dtype=_v.INDEX_NAMES[state_indices.dtype], update=True,
                  l2norm=use_qk_l2norm, gates="given", replay=True, track=track_steps is not None)
    args = dict(
        q=rawk_cache.data_ptr(), k=rawk_cache.data_ptr(), v=rawv_cache.data_ptr(), a=g_cache.data_ptr(),
        b=beta_cache.data_ptr(), state=checkpoint_state.data_ptr(), read_idx=state_indices.data_ptr(),
        acc=accept_lens.data_ptr(), trk_idx=_ptr(track_state_indices), trk_step=_ptr(track_steps),
        slot_stride=HV * V * K, pool_size=L * S,
        # the caches as pools of L * S slots: (slot, token, head) element strides
        q_sn=H * T * K, q_st=K, q_sh=T * K, k_sn=H * T * K, k_st=K, k_sh=T * K, v_sn=HV * T * V, v_st=V, v_sh=T * V,
        a_sn=HV * T, a_st=1, a_sh=T, b_sn=HV * T, b_st=1, b_sh=T, B=L * B, H=H, HV=HV, scale=1.0, zero_padding=0,
        s_head=V * K, s_row=K, read_sn=1, layer_rows=B, layer_slots=S, min_slot=null_block_id + 1,
    )
    dev = launch_device(device, require_cuda)
    return COMMIT.call(params, dict(B=L * B, H=H, HV=HV), args, dev, pdl=uses_pdl(dev) if require_cuda else False)
