"""gdnjit's ops as PyTorch custom ops, for ``torch.compile`` (``fullgraph=True``) and CUDA graphs.

Importing this module registers the ops (namespace ``gdnjit``); ``import gdnjit`` alone does not
(the plain functions in :mod:`gdnjit.gdn` / :mod:`gdnjit.nvfp4` stay the fast eager path)::

    import gdnjit.torch_ops as ops            # registers torch.ops.gdnjit.*

    out, pool = ops.gated_delta_rule_mtp(q, k, v, pool, slots, A_log, a, dt_bias, b,
                                         intermediate_states_buffer=buf, disable_state_update=True)
    fn = torch.compile(step, fullgraph=True)  # step() calls ops.* (or torch.ops.gdnjit.*)

Two ways to call each op:

* ``gdnjit.torch_ops.<name>(...)`` — a thin wrapper with exactly the eager function's signature and
  return value (``(output, state)`` for GDN, ``(fp4, sf)`` for NVFP4). It allocates ``output`` when
  it is not given and calls the raw op. Use it in code that ``torch.compile`` traces.
* ``torch.ops.gdnjit.<name>(...)`` — the raw custom op (schemas below). A custom op may not return
  an alias of an input, so the GDN ops take ``output`` as a required, mutated argument and return
  nothing; the state (direct state or pool), the output and the intermediate buffer are declared
  mutated (``Tensor(a!)``) and are written in place.

The schemas are declared once, by name, in ``SCHEMAS`` below (``torch.ops.gdnjit.<name>.default._schema`` shows
what is registered).

``engine_step`` is :func:`gdnjit.gdn_engine.engine_step`, the one kernel call behind :mod:`gdnjit.compat`'s
vLLM and SGLang entry points (which call it through this op while torch.compile traces). ``spec_step`` is
:func:`gdnjit.gated_delta_rule_spec_step` (the wrapper takes a :class:`gdnjit.SpecCache` and allocates a zeroed
output when none is given). ``lazy_step``, ``lazy_fold`` and ``lazy_reset`` are :func:`gdnjit.gated_delta_rule_lazy_step`
& co. (the wrappers take a :class:`gdnjit.LazyCache`); they run on CUDA tensors only (no CPU reference path).

The NVFP4 global scale is a tensor (``a_global_sf``, read by the kernel: graph-safe) or a Python
float (``a_global_sf_value``, used when the tensor is None); the wrappers split it for you.

Notes:

* Pool mode of ``gated_delta_rule_decode_pretranspose``: FlashInfer callers may pass the pool as both
  ``state`` and ``initial_state``; two mutated arguments must not alias, so the wrapper passes
  ``state=None`` then. ``disable_state_update=True`` still declares the pool mutated (a schema is
  static); that only costs torch.compile a possible copy, never correctness.
* A call through the custom-op dispatcher costs some microseconds of host time more than the plain
  function (also inside a compiled graph, which calls the op from Python); replaying a CUDA graph
  costs neither. Eager serving code should call :func:`gdnjit.gated_delta_rule_decode_pretranspose`
  & co. directly.
* CUDA tensors run the JIT kernels (the same code path as the eager functions, launched on the
  current stream, capturable in CUDA graphs). CPU tensors run the torch references
  (:mod:`gdnjit.reference`) in float32: slow, for tests and CPU-side tracing, not for serving.
* The fake (meta) implementations only compute shapes and dtypes; argument errors surface when the
  real op runs (the same ``TypeError`` / ``ValueError`` messages as the eager functions). The wrappers check first
  that their tensor and cache arguments are tensors (a TypeError naming the argument, as the eager functions word it),
  before they read a shape or unpack a cache.
"""

from typing import Optional, Tuple

import torch

from . import conv as _conv
from . import gdn as _gdn
from . import gdn_engine as _engine
from . import lazy as _lazy
from . import nvfp4 as _nvfp4
from . import replay as _replay
from . import spec_step as _spec
from . import validate as _v
from .reference.engine import engine_reference
from .reference.replay import replay_commit_reference
from .reference.spec_step import spec_step_reference
from .sf_layout import SfLayout, to_sf_layout

__all__ = [
    "gated_delta_rule_decode_pretranspose",
    "gated_delta_rule_decode",
    "gated_delta_rule_mtp",
    "nvfp4_quantize",
    "dequantize_nvfp4",
    "causal_conv1d_update",
    "engine_step",
    "spec_step",
    "gated_delta_rule_replayssm_commit",
    "lazy_step",
    "lazy_fold",
    "lazy_reset",
    "OP_NAMES",
]

NAMESPACE = "gdnjit"
# Each op's schema, by name: the one declaration (registered below; ``torch.ops.gdnjit.<name>.default._schema``
# prints it back). The ops are registered in this order.
SCHEMAS = {
    "gated_delta_rule_decode_pretranspose": (
        "(Tensor q, Tensor k, Tensor v, Tensor(a!)? state, Tensor A_log, Tensor a, Tensor dt_bias, Tensor b, "
        "float? scale, Tensor(b!) output, bool use_qk_l2norm, Tensor(c!)? initial_state, Tensor? initial_state_indices, "
        "Tensor? output_state_indices, Tensor(d!)? intermediate_states_buffer, bool disable_state_update, "
        "bool zero_padding) -> ()"
    ),
    "gated_delta_rule_decode": (
        "(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor A_log, Tensor a, Tensor dt_bias, Tensor b, "
        "float? scale, Tensor(b!) output, bool use_qk_l2norm) -> ()"
    ),
    "gated_delta_rule_mtp": (
        "(Tensor q, Tensor k, Tensor v, Tensor(a!) initial_state, Tensor initial_state_indices, Tensor A_log, "
        "Tensor a, Tensor dt_bias, Tensor b, float? scale, Tensor(b!) output, Tensor(c!)? intermediate_states_buffer, "
        "Tensor? ssm_state_indices, bool disable_state_update, bool use_qk_l2norm, "
        "Tensor? output_state_indices, bool zero_padding, bool write_once=False) -> ()"
    ),
    "nvfp4_quantize": (
        "(Tensor a, Tensor? a_global_sf, float a_global_sf_value, int sfLayout, bool do_shuffle, int sf_vec_size, "
        "bool? enable_pdl, str backend, bool fast_math, bool per_token, str four_over_six, int e4m3_max, Tensor? row_map, "
        "Tensor? out_scale, float out_scale_value) -> (Tensor, Tensor, Tensor)"
    ),
    "dequantize_nvfp4": (
        "(Tensor fp4, Tensor sf, Tensor? a_global_sf, float a_global_sf_value, int sfLayout, SymInt m, "
        "SymInt k) -> Tensor"
    ),
    "causal_conv1d_update": (
        "(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, bool silu, Tensor? conv_state_indices, "
        "Tensor? num_accepted_tokens, Tensor? query_start_loc, int max_query_len, int? pad_slot_id, Tensor(b!) out) -> ()"
    ),
    "engine_step": (
        "(Tensor q, Tensor k, Tensor v, Tensor? A_log, Tensor a, Tensor? dt_bias, Tensor b, Tensor(a!) state, int T, "
        "Tensor read_idx, Tensor? cu_seqlens, Tensor? num_accepted, Tensor? ssm_idx, Tensor(b!)? inter, "
        "Tensor? inter_idx, Tensor? parent, bool bounded, bool update, str null_slot, str padding, str gates, float? scale, "
        "bool l2norm, float softplus_beta, float softplus_threshold, Tensor(c!) output, Tensor(d!)? rawv, "
        "Tensor(e!)? rawk, Tensor(f!)? g_cache, Tensor(g!)? beta_cache, bool zero_padding, bool round_beta) -> ()"
    ),
    "spec_step": (
        "(Tensor q, Tensor k, Tensor v, Tensor A_log, Tensor a, Tensor dt_bias, Tensor b, Tensor(a!) state, "
        "Tensor state_indices, Tensor num_accepted, Tensor(b!) cache_k, Tensor(c!) cache_v, Tensor(d!) cache_g, "
        "Tensor(e!) cache_beta, Tensor(f!) cache_ctl, float? scale, bool use_qk_l2norm, float softplus_beta, "
        "float softplus_threshold, int null_block_id, Tensor(g!) output) -> ()"
    ),
    "gated_delta_rule_replayssm_commit": (
        "(Tensor(a!) checkpoint_state, Tensor rawv_cache, Tensor rawk_cache, Tensor g_cache, Tensor beta_cache, "
        "Tensor state_indices, Tensor accept_lens, Tensor? track_state_indices, Tensor? track_steps, bool use_qk_l2norm, "
        "int null_block_id, str backend) -> ()"
    ),
    "lazy_step": (
        "(Tensor q, Tensor k, Tensor v, Tensor A_log, Tensor a, Tensor dt_bias, Tensor b, Tensor(a!) state, "
        "Tensor state_indices, Tensor(b!) cache_k, Tensor(c!) cache_u, Tensor(d!) cache_g, Tensor(e!) cache_cursor, "
        "Tensor? num_accepted, float? scale, bool use_qk_l2norm, float softplus_beta, float softplus_threshold, "
        "int null_block_id, Tensor(f!) output) -> ()"
    ),
    "lazy_fold": (
        "(Tensor(a!) state, Tensor state_indices, Tensor cache_k, Tensor cache_u, Tensor cache_g, "
        "Tensor(b!) cache_cursor, Tensor? num_accepted, int null_block_id) -> ()"
    ),
    "lazy_reset": "(Tensor state_indices, Tensor(a!) cache_cursor, int null_block_id) -> ()",
}
OP_NAMES = tuple(SCHEMAS)

# ---- CPU implementations (torch reference, float32) -------------------------------------------


def _reference_gdn(layout, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output, inter, ssm,
                   update, l2norm, direct, zero_padding=True):
    """Validate exactly as the CUDA path does (every check but the device type), then compute with the
    torch reference in float32 and write the results in place."""
    from .reference.gdn import gdn_reference

    _gdn.prepare(layout, q, k, v, A_log, a, dt_bias, b, pool, read_idx, write_idx, scale, output, inter, ssm,
                  update, l2norm, direct, require_cuda=False, zero_padding=zero_padding)
    if q.shape[0] == 0:
        return
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool, layout=layout, scale=scale, use_qk_l2norm=l2norm,
                        read_indices=read_idx, write_indices=write_idx, intermediate=inter,
                        ssm_state_indices=ssm, disable_state_update=not update, dtype=torch.float32)
    if zero_padding or read_idx is None:
        output.copy_(ref.output)
    else:  # padding rows keep the caller's values
        live = (read_idx >= 0).view(-1, 1, 1, 1)
        output.copy_(torch.where(live, ref.output.to(output.dtype), output))
    if update:
        pool.copy_(ref.state)
    if inter is not None:
        inter.copy_(ref.intermediate)


# ---- GDN ------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::gated_delta_rule_decode_pretranspose",
                         mutates_args=("state", "output", "initial_state", "intermediate_states_buffer"),
                         schema=SCHEMAS["gated_delta_rule_decode_pretranspose"])
def _decode_pretranspose_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor], A_log: torch.Tensor,
    a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, scale: Optional[float], output: torch.Tensor,
    use_qk_l2norm: bool, initial_state: Optional[torch.Tensor], initial_state_indices: Optional[torch.Tensor],
    output_state_indices: Optional[torch.Tensor], intermediate_states_buffer: Optional[torch.Tensor],
    disable_state_update: bool, zero_padding: bool,
) -> None:
    pool, read, write, direct = _gdn.pool_args(state, initial_state, initial_state_indices, output_state_indices)
    if q.device.type != "cpu":
        _gdn.run("klast", q, k, v, A_log, a, dt_bias, b, pool, read, write, scale, output, intermediate_states_buffer,
                  None, not disable_state_update, use_qk_l2norm, direct=direct, zero_padding=zero_padding)
        return
    _reference_gdn("klast", q, k, v, A_log, a, dt_bias, b, pool, read, write, scale, output,
                   intermediate_states_buffer, None, not disable_state_update, use_qk_l2norm, direct, zero_padding)


@_decode_pretranspose_op.register_fake
def _(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state, initial_state_indices,
      output_state_indices, intermediate_states_buffer, disable_state_update, zero_padding) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::gated_delta_rule_decode", mutates_args=("state", "output"),
                         schema=SCHEMAS["gated_delta_rule_decode"])
def _decode_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, A_log: torch.Tensor, a: torch.Tensor,
    dt_bias: torch.Tensor, b: torch.Tensor, scale: Optional[float], output: torch.Tensor, use_qk_l2norm: bool,
) -> None:
    if q.device.type != "cpu":
        _gdn.gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale=scale, output=output,
                                     use_qk_l2norm=use_qk_l2norm)
        return
    _reference_gdn("kmajor", q, k, v, A_log, a, dt_bias, b, state, None, None, scale, output, None, None, True,
                   use_qk_l2norm, True)


@_decode_op.register_fake
def _(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::gated_delta_rule_mtp",
                         mutates_args=("initial_state", "output", "intermediate_states_buffer"),
                         schema=SCHEMAS["gated_delta_rule_mtp"])
def _mtp_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor, A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
    b: torch.Tensor, scale: Optional[float], output: torch.Tensor,
    intermediate_states_buffer: Optional[torch.Tensor], ssm_state_indices: Optional[torch.Tensor],
    disable_state_update: bool, use_qk_l2norm: bool, output_state_indices: Optional[torch.Tensor],
    zero_padding: bool, write_once: bool = False,
) -> None:
    if q.device.type != "cpu":
        _gdn.run("klast", q, k, v, A_log, a, dt_bias, b, initial_state, initial_state_indices, output_state_indices,
                  scale, output, intermediate_states_buffer, ssm_state_indices, not disable_state_update,
                  use_qk_l2norm, direct=False, zero_padding=zero_padding, write_once=write_once)
        return
    _reference_gdn("klast", q, k, v, A_log, a, dt_bias, b, initial_state, initial_state_indices,
                   output_state_indices, scale, output, intermediate_states_buffer, ssm_state_indices,
                   not disable_state_update, use_qk_l2norm, False, zero_padding)


@_mtp_op.register_fake
def _(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
      intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
      output_state_indices, zero_padding, write_once=False) -> None:
    return None


def _tensors(optional: tuple = (), **args) -> None:
    """A wrapper's tensor arguments, checked before it reads a shape or a device or unpacks a cache: TypeError naming
    the first that is not a tensor (those named in ``optional`` may be None), worded as the eager functions' checks.
    The ops' own checks (shapes, dtypes, devices) then run inside the op."""
    for name, x in args.items():
        if x is None and name in optional:
            continue
        _v.tensor(name, x)


def _cache(name: str, cache, kind: type, optional: bool = False) -> None:
    """A wrapper's cache argument (a :class:`gdnjit.LazyCache` / :class:`gdnjit.SpecCache`, or a tuple of as many
    tensors; None where ``optional``): TypeError naming it before the wrapper unpacks it."""
    if cache is None and optional:
        return
    if not isinstance(cache, tuple) or len(cache) != len(kind._fields):
        raise TypeError(f"{name}: expected a gdnjit.{kind.__name__} (or a tuple of {len(kind._fields)} tensors), got "
                        f"{type(cache).__name__}")
    for field, x in zip(kind._fields, cache):
        _v.tensor(f"{name}.{field}", x)


def _float(name: str, x) -> float:
    """A float argument the wrapper converts: TypeError naming it when it is not a number."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        raise TypeError(f"{name}: expected a Python float, got {type(x).__name__}")
    return float(x)


def _output(q: torch.Tensor, v: torch.Tensor, output: Optional[torch.Tensor]) -> torch.Tensor:
    if output is not None:
        return output
    if not isinstance(q, torch.Tensor) or not isinstance(v, torch.Tensor) or q.dim() != 4 or v.dim() != 4:
        return None  # let the op's validation report the bad argument
    B, T, HV, V = v.shape
    return torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)


def gated_delta_rule_decode_pretranspose(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor], A_log: torch.Tensor,
    a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, scale: Optional[float] = None,
    output: Optional[torch.Tensor] = None, use_qk_l2norm: bool = True, initial_state: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None, output_state_indices: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None, disable_state_update: Optional[bool] = False,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdnjit.gated_delta_rule_decode_pretranspose` through ``torch.ops.gdnjit``; same arguments and
    return value ``(output, state_or_pool)``."""
    _tensors(("state", "output", "initial_state", "initial_state_indices", "output_state_indices",
              "intermediate_states_buffer"), q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
             output=output, initial_state=initial_state, initial_state_indices=initial_state_indices,
             output_state_indices=output_state_indices, intermediate_states_buffer=intermediate_states_buffer)
    frozen, zero_padding = _gdn.plan_pretranspose(q, initial_state, output, intermediate_states_buffer,
                                                  disable_state_update, backend)
    out = _output(q, v, output)
    if initial_state is not None and state is initial_state:
        state = None  # FlashInfer style: the pool passed twice; two mutated args must not alias
    torch.ops.gdnjit.gated_delta_rule_decode_pretranspose(
        q, k, v, state, A_log, a, dt_bias, b, scale, out, use_qk_l2norm, initial_state, initial_state_indices,
        output_state_indices, intermediate_states_buffer, frozen, zero_padding)
    return out, (initial_state if initial_state is not None else state)


def gated_delta_rule_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, A_log: torch.Tensor, a: torch.Tensor,
    dt_bias: torch.Tensor, b: torch.Tensor, scale: Optional[float] = None, output: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True, backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdnjit.gated_delta_rule_decode` (K-major state) through ``torch.ops.gdnjit``; returns
    ``(output, state)``."""
    _tensors(("output",), q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, output=output)
    _gdn.check_backend(backend, _gdn.BACKENDS_DECODE)
    out = _output(q, v, output)
    torch.ops.gdnjit.gated_delta_rule_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, use_qk_l2norm)
    return out, state


def gated_delta_rule_mtp(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor, A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
    b: torch.Tensor, scale: Optional[float] = None, output: Optional[torch.Tensor] = None,
    intermediate_states_buffer: Optional[torch.Tensor] = None, ssm_state_indices: Optional[torch.Tensor] = None,
    disable_state_update: Optional[bool] = None, use_qk_l2norm: bool = True,
    output_state_indices: Optional[torch.Tensor] = None, cache_replayssm: bool = False,
    replayssm_rawv: Optional[torch.Tensor] = None, replayssm_rawk: Optional[torch.Tensor] = None,
    replayssm_g: Optional[torch.Tensor] = None, replayssm_beta: Optional[torch.Tensor] = None,
    accepted_steps: Optional[torch.Tensor] = None, recovery_steps: int = 0, disable_output: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdnjit.gated_delta_rule_mtp` through ``torch.ops.gdnjit``; returns ``(output, initial_state)``. With
    ``cache_replayssm=True`` (FlashInfer's ReplaySSM verify) the call runs as ``torch.ops.gdnjit.engine_step``, which
    writes the four caches; the state-recovery arguments become the op's per-token write map (:mod:`gdnjit.recovery`)."""
    _tensors(("output", "intermediate_states_buffer", "ssm_state_indices", "output_state_indices", "replayssm_rawv",
              "replayssm_rawk", "replayssm_g", "replayssm_beta", "accepted_steps"),
             q=q, k=k, v=v, initial_state=initial_state, initial_state_indices=initial_state_indices, A_log=A_log, a=a,
             dt_bias=dt_bias, b=b, output=output, intermediate_states_buffer=intermediate_states_buffer,
             ssm_state_indices=ssm_state_indices, output_state_indices=output_state_indices,
             replayssm_rawv=replayssm_rawv, replayssm_rawk=replayssm_rawk, replayssm_g=replayssm_g,
             replayssm_beta=replayssm_beta, accepted_steps=accepted_steps)
    plan = _gdn.plan_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, output,
                         intermediate_states_buffer, ssm_state_indices, disable_state_update, use_qk_l2norm,
                         output_state_indices, cache_replayssm, replayssm_rawv, replayssm_rawk, replayssm_g,
                         replayssm_beta, accepted_steps, recovery_steps, disable_output)
    if plan.verify is not None:
        args, kwargs = plan.verify
        return engine_step(*args, **kwargs), initial_state
    out = _output(q, v, None if plan.scratch_output else output)
    torch.ops.gdnjit.gated_delta_rule_mtp(
        q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, out,
        intermediate_states_buffer, plan.ssm, plan.frozen, use_qk_l2norm, plan.write_idx, plan.zero_padding,
        plan.write_once)
    return (output if plan.scratch_output and output is not None else out), initial_state


# ---- NVFP4 ----------------------------------------------------------------------------------


def _split_global_sf(a_global_sf):
    """(tensor or None, float value) for the ops' two global-scale arguments."""
    if isinstance(a_global_sf, torch.Tensor):
        return a_global_sf, 1.0
    if isinstance(a_global_sf, bool) or not isinstance(a_global_sf, (int, float)):
        raise TypeError(
            f"a_global_sf: expected a one-element float32 tensor or a Python float, got {type(a_global_sf).__name__}")
    return None, float(a_global_sf)


def _round_up(x, m):
    return (x + m - 1) // m * m


@torch.library.custom_op(f"{NAMESPACE}::nvfp4_quantize", mutates_args=(), schema=SCHEMAS["nvfp4_quantize"])
def _nvfp4_quantize_op(
    a: torch.Tensor, a_global_sf: Optional[torch.Tensor], a_global_sf_value: float, sfLayout: int,
    do_shuffle: bool, sf_vec_size: int, enable_pdl: Optional[bool], backend: str, fast_math: bool, per_token: bool,
    four_over_six: str, e4m3_max: int, row_map: Optional[torch.Tensor], out_scale: Optional[torch.Tensor],
    out_scale_value: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gs = a_global_sf if a_global_sf is not None else a_global_sf_value
    if a.device.type == "cpu" and backend in ("gdnjit", "cuda", "cute-dsl"):
        backend = "reference"  # no kernel on the CPU: the reference is bit-identical
    four6 = None if four_over_six == "off" else _nvfp4.FourOverSix(four_over_six[:3], four_over_six.endswith("_fp16"),
                                                                   e4m3_max)
    out = _nvfp4.nvfp4_quantize(a, gs, sfLayout=sfLayout, do_shuffle=do_shuffle, sf_vec_size=sf_vec_size,
                                enable_pdl=enable_pdl, backend=backend, per_token_activation=per_token,
                                expanded_idx_to_permuted_idx=row_map,
                                out_scale=out_scale if out_scale is not None or not per_token else out_scale_value,
                                nvfp4_4over6=four6, fast_math=fast_math)
    if not per_token:  # one schema for both modes: no per-token scales
        return out[0], out[1], a.new_empty((0,), dtype=torch.float32)
    return out


@_nvfp4_quantize_op.register_fake
def _(a, a_global_sf, a_global_sf_value, sfLayout, do_shuffle, sf_vec_size, enable_pdl, backend, fast_math, per_token,
      four_over_six, e4m3_max, row_map, out_scale, out_scale_value):
    K = a.shape[-1]
    M = a.numel() // K
    n = K // 16
    layout = to_sf_layout(sfLayout)
    if layout == SfLayout.layout_128x4:
        rows, cols = _round_up(M, 128), _round_up(n, 4)
    elif layout == SfLayout.layout_8x4:
        rows, cols = _round_up(M, 8), _round_up(n, 4)
    else:
        rows, cols = M, n
    return (a.new_empty((M, K // 2), dtype=torch.uint8), a.new_empty((rows, cols), dtype=torch.uint8),
            a.new_empty((M if per_token else 0,), dtype=torch.float32))


@torch.library.custom_op(f"{NAMESPACE}::dequantize_nvfp4", mutates_args=(), schema=SCHEMAS["dequantize_nvfp4"])
def _dequantize_nvfp4_op(
    fp4: torch.Tensor, sf: torch.Tensor, a_global_sf: Optional[torch.Tensor], a_global_sf_value: float,
    sfLayout: int, m: int, k: int,
) -> torch.Tensor:
    gs = a_global_sf if a_global_sf is not None else a_global_sf_value
    return _nvfp4.dequantize_nvfp4(fp4, sf, gs, sfLayout=sfLayout, m=m, k=k)


@_dequantize_nvfp4_op.register_fake
def _(fp4, sf, a_global_sf, a_global_sf_value, sfLayout, m, k):
    return fp4.new_empty((m, k), dtype=torch.float32)


def nvfp4_quantize(a: torch.Tensor, a_global_sf, sfLayout=SfLayout.layout_128x4, do_shuffle: bool = False,
                   sf_vec_size: int = 16, enable_pdl: Optional[bool] = None, backend: str = "gdnjit",
                   per_token_activation: bool = False, expanded_idx_to_permuted_idx: Optional[torch.Tensor] = None,
                   out_scale: Optional[torch.Tensor] = None, nvfp4_4over6=_nvfp4.UNSET, *,
                   fast_math: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdnjit.nvfp4_quantize` through ``torch.ops.gdnjit``; returns ``(fp4, sf)``, or ``(fp4, sf,
    per_token_scale)`` with ``per_token_activation``. The recipe switches (``fast_math``, ``nvfp4_4over6`` or
    FlashInfer's environment variables) are read here, per call, and passed to the op."""
    _tensors(("expanded_idx_to_permuted_idx",), a=a, expanded_idx_to_permuted_idx=expanded_idx_to_permuted_idx)
    four6 = _nvfp4.check_flashinfer_extras(a, a_global_sf, backend, per_token_activation,
                                            expanded_idx_to_permuted_idx, out_scale, nvfp4_4over6)
    fast = _nvfp4.choose_recipe(fast_math, getattr(a, "dtype", None)) == "fast"
    t, value = _split_global_sf(a_global_sf)
    layout = int(_nvfp4.to_layout(sfLayout))
    # out_scale: a tensor (read by the kernel) or a number (a kernel argument: no copy, graph-safe); none = 1
    osc, osc_value = (out_scale, 1.0) if isinstance(out_scale, torch.Tensor) or out_scale is None else (None, out_scale)
    fp4, sf, pts = torch.ops.gdnjit.nvfp4_quantize(
        a, t, value, layout, do_shuffle, sf_vec_size, enable_pdl, backend, fast, per_token_activation,
        "off" if four6 is None else four6.param, 448 if four6 is None else four6.e4m3_max,
        expanded_idx_to_permuted_idx, osc, osc_value)
    return (fp4, sf, pts) if per_token_activation else (fp4, sf)


def dequantize_nvfp4(fp4: torch.Tensor, sf: torch.Tensor, a_global_sf, sfLayout=SfLayout.layout_128x4,
                     m: Optional[int] = None, k: Optional[int] = None) -> torch.Tensor:
    """:func:`gdnjit.dequantize_nvfp4` through ``torch.ops.gdnjit``; float32 ``[m, k]``."""
    _tensors(fp4=fp4, sf=sf)
    m, k = _nvfp4.rows_and_cols(fp4, m, k)
    t, value = _split_global_sf(a_global_sf)
    layout = int(_nvfp4.to_layout(sfLayout))
    return torch.ops.gdnjit.dequantize_nvfp4(fp4, sf, t, value, layout, m, k)


# ---- causal conv1d ----------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::causal_conv1d_update", mutates_args=("conv_state", "out"),
                         schema=SCHEMAS["causal_conv1d_update"])
def _conv_op(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
             silu: bool, conv_state_indices: Optional[torch.Tensor], num_accepted_tokens: Optional[torch.Tensor],
             query_start_loc: Optional[torch.Tensor], max_query_len: int, pad_slot_id: Optional[int],
             out: torch.Tensor) -> None:
    args = (x, conv_state, weight, bias, silu, conv_state_indices, num_accepted_tokens, query_start_loc,
            max_query_len, pad_slot_id)
    if x.device.type != "cpu":
        _conv.causal_conv1d_update(*args, out=out)
        return
    from .reference.conv import conv_reference

    _conv.prepare(*args, out, require_cuda=False)  # the CUDA path's checks
    ref, state = conv_reference(*args, dtype=torch.float32)
    out.copy_(ref)
    conv_state.copy_(state)


@_conv_op.register_fake
def _(x, conv_state, weight, bias, silu, conv_state_indices, num_accepted_tokens, query_start_loc, max_query_len,
      pad_slot_id, out) -> None:
    return None


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, activation=None,
                         conv_state_indices: Optional[torch.Tensor] = None,
                         num_accepted_tokens: Optional[torch.Tensor] = None,
                         query_start_loc: Optional[torch.Tensor] = None, max_query_len: int = -1,
                         pad_slot_id: Optional[int] = _conv.PAD_SLOT_ID, block_idx_last_scheduled_token=None,
                         initial_state_idx=None, retrieve_parent_token=None, validate_data: bool = False,
                         out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`gdnjit.causal_conv1d_update` through ``torch.ops.gdnjit``; returns ``out``. ``out=x`` (in place)
    is refused here: a custom op's mutated output may not alias its input."""
    _tensors(("bias", "conv_state_indices", "num_accepted_tokens", "query_start_loc", "out"), x=x,
             conv_state=conv_state, weight=weight, bias=bias, conv_state_indices=conv_state_indices,
             num_accepted_tokens=num_accepted_tokens, query_start_loc=query_start_loc, out=out)
    _conv.unsupported(block_idx_last_scheduled_token, initial_state_idx, retrieve_parent_token)
    if out is x:
        raise ValueError("out: the torch op cannot write into x in place; pass out=None or another tensor")
    out = torch.empty_like(x) if out is None else out
    torch.ops.gdnjit.causal_conv1d_update(x, conv_state, weight, bias, _conv.silu_flag(activation),
                                          conv_state_indices, num_accepted_tokens, query_start_loc, max_query_len,
                                          pad_slot_id, out)
    return out


# ---- the engine step (gdnjit.compat) ---------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::engine_step",
                         mutates_args=("state", "inter", "output", "rawv", "rawk", "g_cache", "beta_cache"),
                         schema=SCHEMAS["engine_step"])
def _engine_op(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx, inter,
               inter_idx, parent, bounded, update, null_slot, padding, gates, scale, l2norm, softplus_beta,
               softplus_threshold, output, rawv, rawk, g_cache, beta_cache, zero_padding, round_beta) -> None:
    caches = None if rawv is None else (rawv, rawk, g_cache, beta_cache)
    kw = dict(T=T, read_idx=read_idx, cu_seqlens=cu_seqlens, num_accepted=num_accepted, ssm_idx=ssm_idx, inter=inter,
              inter_idx=inter_idx, parent=parent, bounded=bounded, update=update, null_slot=null_slot, padding=padding,
              gates=gates,
              scale=scale, l2norm=l2norm, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    if q.device.type != "cpu":
        _engine.engine_step(q, k, v, A_log, a, dt_bias, b, state, output=output, replay_cache=caches,
                            zero_padding=zero_padding, round_beta=round_beta, **kw)
        return
    _engine.prepare(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx, inter,
                     inter_idx, parent, bounded, update, null_slot, padding, gates, scale, l2norm, softplus_beta,
                     softplus_threshold, output, require_cuda=False, replay_cache=caches, zero_padding=zero_padding,
                     round_beta=round_beta)
    ref = engine_reference(q, k, v, A_log, a, dt_bias, b, state, dtype=torch.float32, replay_cache=caches,
                           round_beta=round_beta, **kw)
    if zero_padding:
        output.copy_(ref.output)
    else:  # a skipped request's output rows keep their values
        output.copy_(torch.where(ref.skipped[..., None, None].to(output.device), output, ref.output.to(output.dtype)))
    state.copy_(ref.state)
    if inter is not None:
        inter.copy_(ref.intermediate)
    if caches is not None:
        for dst, src in zip(caches, ref.replay_cache):
            dst.copy_(src)


@_engine_op.register_fake
def _(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx, inter, inter_idx, parent,
      bounded, update, null_slot, padding, gates, scale, l2norm, softplus_beta, softplus_threshold, output, rawv, rawk,
      g_cache, beta_cache, zero_padding, round_beta) -> None:
    return None


def engine_step(q, k, v, A_log, a, dt_bias, b, state, *, T, read_idx, cu_seqlens=None, num_accepted=None,
                ssm_idx=None, inter=None, inter_idx=None, parent=None, bounded=False, update=True, null_slot="negative",
                padding="skip", gates="raw", scale=None, l2norm=True, softplus_beta=1.0, softplus_threshold=20.0,
                output=None, replay_cache=None, zero_padding=True, round_beta=False) -> torch.Tensor:
    """:func:`gdnjit.gdn_engine.engine_step` through ``torch.ops.gdnjit``; returns the output."""
    _tensors(("A_log", "dt_bias", "cu_seqlens", "num_accepted", "ssm_idx", "inter", "inter_idx", "parent", "output"),
             q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b, state=state, read_idx=read_idx,
             cu_seqlens=cu_seqlens, num_accepted=num_accepted, ssm_idx=ssm_idx, inter=inter, inter_idx=inter_idx,
             parent=parent, output=output)
    if replay_cache is not None and (not isinstance(replay_cache, tuple) or len(replay_cache) != 4):
        raise TypeError(f"replay_cache: expected None or a tuple of 4 tensors (rawv, rawk, g, beta), got "
                        f"{type(replay_cache).__name__}")
    _tensors(**{f"replay_cache[{i}]": x for i, x in enumerate(replay_cache or ())})
    if output is None:
        _v.tensor("q", q, 4)  # their shapes give the output's
        _v.tensor("v", v, 4)
        output = torch.empty((*q.shape[:2], v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
    torch.ops.gdnjit.engine_step(q, k, v, A_log, a, dt_bias, b, state, T, read_idx, cu_seqlens, num_accepted, ssm_idx,
                                 inter, inter_idx, parent, bounded, update, null_slot, padding, gates, scale, l2norm,
                                 _float("softplus_beta", softplus_beta),
                                 _float("softplus_threshold", softplus_threshold), output, *(replay_cache if replay_cache is not None else (None,) * 4), zero_padding,
                                 round_beta)
    return output


# ---- the fused speculative step (gdnjit.spec_step) -------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::spec_step",
                         mutates_args=("state", "cache_k", "cache_v", "cache_g", "cache_beta", "cache_ctl", "output"),
                         schema=SCHEMAS["spec_step"])
def _spec_step_op(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache_k, cache_v, cache_g,
                  cache_beta, cache_ctl, scale, use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id,
                  output) -> None:
    cache = _spec.SpecCache(cache_k, cache_v, cache_g, cache_beta, cache_ctl)
    kw = dict(scale=scale, use_qk_l2norm=use_qk_l2norm, softplus_beta=softplus_beta,
              softplus_threshold=softplus_threshold, null_block_id=null_block_id)
    if q.device.type != "cpu":
        _spec.gated_delta_rule_spec_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache,
                                         output=output, **kw)
        return
    _spec.prepare(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache, scale, use_qk_l2norm,
                   softplus_beta, softplus_threshold, null_block_id, output, require_cuda=False)
    ref = spec_step_reference(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache,
                              dtype=torch.float32, **kw)
    live = (state_indices > null_block_id).view(-1, 1, 1, 1)
    output.copy_(torch.where(live, ref.output.to(output.dtype), output))  # padding rows left as they were
    state.copy_(ref.state)
    for dst, src in zip(cache, ref.cache):
        dst.copy_(src)


@_spec_step_op.register_fake
def _(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache_k, cache_v, cache_g, cache_beta,
      cache_ctl, scale, use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id, output) -> None:
    return None


def spec_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, cache, *, scale=None,
              use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0, null_block_id=-1,
              output=None) -> torch.Tensor:
    """:func:`gdnjit.gated_delta_rule_spec_step` through ``torch.ops.gdnjit``; returns the output (allocated zeroed
    when not given, so padding rows read 0 as in the eager function)."""
    _tensors(("output",), q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b, state=state,
             state_indices=state_indices, num_accepted=num_accepted, output=output)
    _cache("cache", cache, _spec.SpecCache)
    if output is None:
        _v.tensor("q", q, 4)  # their shapes give the output's
        _v.tensor("v", v, 4)
        output = torch.zeros((*q.shape[:2], v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
    torch.ops.gdnjit.spec_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, num_accepted, *cache, scale,
                               use_qk_l2norm, _float("softplus_beta", softplus_beta),
                               _float("softplus_threshold", softplus_threshold), null_block_id, output)
    return output


# ---- FlashInfer's ReplaySSM commit (gdnjit.replay) --------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::gated_delta_rule_replayssm_commit", mutates_args=("checkpoint_state",),
                         schema=SCHEMAS["gated_delta_rule_replayssm_commit"])
def _commit_op(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
               track_state_indices, track_steps, use_qk_l2norm, null_block_id, backend) -> None:
    kw = dict(track_state_indices=track_state_indices, track_steps=track_steps, use_qk_l2norm=use_qk_l2norm,
              null_block_id=null_block_id)
    if checkpoint_state.device.type != "cpu":
        _replay.gated_delta_rule_replayssm_commit(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache,
                                                  state_indices, accept_lens, backend=backend, **kw)
        return
    _replay.check_backend(backend)
    _replay.prepare(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens,
                     track_state_indices, track_steps, use_qk_l2norm, null_block_id, require_cuda=False)
    if backend == "tcgen05":
        _replay.refuse_tcgen05(rawk_cache.shape[3], use_qk_l2norm, track_steps is not None)
    checkpoint_state.copy_(replay_commit_reference(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache,
                                                   state_indices, accept_lens, dtype=torch.float32, **kw))


@_commit_op.register_fake
def _(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices, accept_lens, track_state_indices,
      track_steps, use_qk_l2norm, null_block_id, backend) -> None:
    return None


def gated_delta_rule_replayssm_commit(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache, state_indices,
                                      accept_lens, *, track_state_indices=None, track_steps=None, use_qk_l2norm=True,
                                      null_block_id=-1, backend="auto") -> None:
    """:func:`gdnjit.gated_delta_rule_replayssm_commit` through ``torch.ops.gdnjit`` (the checkpoint updated in
    place)."""
    _tensors(("track_state_indices", "track_steps"), checkpoint_state=checkpoint_state, rawv_cache=rawv_cache,
             rawk_cache=rawk_cache, g_cache=g_cache, beta_cache=beta_cache, state_indices=state_indices,
             accept_lens=accept_lens, track_state_indices=track_state_indices, track_steps=track_steps)
    torch.ops.gdnjit.gated_delta_rule_replayssm_commit(checkpoint_state, rawv_cache, rawk_cache, g_cache, beta_cache,
                                                       state_indices, accept_lens, track_state_indices, track_steps,
                                                       use_qk_l2norm, null_block_id, backend)


# ---- the lazy state (gdnjit.lazy) ----------------------------------------------------------------------


def _cuda_only(name: str, x: torch.Tensor) -> None:
    if x.device.type != "cuda":
        raise NotImplementedError(f"gdnjit::{name}: runs on CUDA tensors only, got {x.device.type} tensors")


@torch.library.custom_op(f"{NAMESPACE}::lazy_step",
                         mutates_args=("state", "cache_k", "cache_u", "cache_g", "cache_cursor", "output"),
                         schema=SCHEMAS["lazy_step"])
def _lazy_step_op(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache_k, cache_u, cache_g, cache_cursor,
                  num_accepted, scale, use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id, output) -> None:
    _cuda_only("lazy_step", state)
    cache = _lazy.LazyCache(cache_k, cache_u, cache_g, cache_cursor)
    _lazy.gated_delta_rule_lazy_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache,
                                     num_accepted=num_accepted, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                     softplus_beta=softplus_beta, softplus_threshold=softplus_threshold,
                                     null_block_id=null_block_id, output=output)


@_lazy_step_op.register_fake
def _(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache_k, cache_u, cache_g, cache_cursor, num_accepted,
      scale, use_qk_l2norm, softplus_beta, softplus_threshold, null_block_id, output) -> None:
    return None


def lazy_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, cache, *, num_accepted=None, scale=None,
              use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0, null_block_id=-1,
              output=None) -> torch.Tensor:
    """:func:`gdnjit.gated_delta_rule_lazy_step` through ``torch.ops.gdnjit``; returns the output (allocated zeroed
    when not given, so padding rows read 0 as in the eager function)."""
    _tensors(("num_accepted", "output"), q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b, state=state,
             state_indices=state_indices, num_accepted=num_accepted, output=output)
    _cache("cache", cache, _lazy.LazyCache)
    if output is None:
        _v.tensor("q", q, 4)  # their shapes give the output's
        _v.tensor("v", v, 4)
        output = torch.zeros((*q.shape[:2], v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
    torch.ops.gdnjit.lazy_step(q, k, v, A_log, a, dt_bias, b, state, state_indices, *cache, num_accepted, scale,
                               use_qk_l2norm, _float("softplus_beta", softplus_beta),
                               _float("softplus_threshold", softplus_threshold), null_block_id, output)
    return output


@torch.library.custom_op(f"{NAMESPACE}::lazy_fold", mutates_args=("state", "cache_cursor"), schema=SCHEMAS["lazy_fold"])
def _lazy_fold_op(state, state_indices, cache_k, cache_u, cache_g, cache_cursor, num_accepted, null_block_id) -> None:
    _cuda_only("lazy_fold", state)
    _lazy.gated_delta_rule_lazy_fold(state, state_indices, _lazy.LazyCache(cache_k, cache_u, cache_g, cache_cursor),
                                     num_accepted=num_accepted, null_block_id=null_block_id)


@_lazy_fold_op.register_fake
def _(state, state_indices, cache_k, cache_u, cache_g, cache_cursor, num_accepted, null_block_id) -> None:
    return None


def lazy_fold(state, state_indices, cache, *, num_accepted=None, null_block_id=-1) -> None:
    """:func:`gdnjit.gated_delta_rule_lazy_fold` through ``torch.ops.gdnjit`` (state and cursors updated in place)."""
    _tensors(("num_accepted",), state=state, state_indices=state_indices, num_accepted=num_accepted)
    _cache("cache", cache, _lazy.LazyCache)
    torch.ops.gdnjit.lazy_fold(state, state_indices, *cache, num_accepted, null_block_id)


@torch.library.custom_op(f"{NAMESPACE}::lazy_reset", mutates_args=("cache_cursor",), schema=SCHEMAS["lazy_reset"])
def _lazy_reset_op(state_indices, cache_cursor, null_block_id) -> None:
    _cuda_only("lazy_reset", cache_cursor)
    cache = _lazy.LazyCache(cache_cursor, cache_cursor, cache_cursor, cache_cursor)  # a reset reads only the cursors
    _lazy.gated_delta_rule_lazy_reset(state_indices, cache, null_block_id=null_block_id)


@_lazy_reset_op.register_fake
def _(state_indices, cache_cursor, null_block_id) -> None:
    return None


def lazy_reset(state_indices, cache, *, null_block_id=-1) -> None:
    """:func:`gdnjit.gated_delta_rule_lazy_reset` through ``torch.ops.gdnjit`` (cursors updated in place)."""
    _tensors(state_indices=state_indices)
    _cache("cache", cache, _lazy.LazyCache)
    torch.ops.gdnjit.lazy_reset(state_indices, cache[3], null_block_id)
