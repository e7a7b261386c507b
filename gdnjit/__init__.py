"""gdnjit: JIT-generated CUDA kernels for hybrid linear-attention decode (gated delta rule, NVFP4, conv1d).

Public API (FlashInfer-compatible names and parameters):

- :func:`gated_delta_rule_decode_pretranspose` — decode, K-last state, direct or pooled
- :func:`gated_delta_rule_decode` — decode, K-major state
- :func:`gated_delta_rule_mtp` — multi-token / speculative verify step over a state pool
- :func:`nvfp4_quantize`, :class:`SfLayout`, :func:`dequantize_nvfp4` — NVFP4 activation quantization;
  :func:`fp4_quantize` — FlashInfer's ``fp4_quantize`` (its layout flags) over the same kernel
- :func:`causal_conv1d_update` — the short causal conv before GDN (vLLM's signature), over a conv-state pool
- :func:`gated_delta_rule_replayssm_commit` — FlashInfer's ReplaySSM commit: replay accepted cached tokens into
  checkpoints (with ``gated_delta_rule_mtp(cache_replayssm=True, ...)``)
- :func:`gated_delta_rule_spec_step`, :func:`gated_delta_rule_spec_flush`, :class:`SpecCache`, :func:`spec_cache` —
  gdnjit's fused speculative step: replay the previous step's accepted tokens and verify the new ones in one pass
- :func:`gated_delta_rule_lazy_step`, :func:`gated_delta_rule_lazy_fold`, :func:`gated_delta_rule_lazy_reset`,
  :class:`LazyCache`, :func:`lazy_cache` — lazy state: plain and speculative steps at one read of the state, the
  state written only when a slot folds its ring of recent tokens
- :func:`gated_delta_rule_mtp_ucache`, :func:`gated_delta_rule_mtp_ucache_flush` — FlashInfer's u-cache verify and
  verify+flush calls over the same kernel

Kernels are rendered from YAML specs + Jinja templates, compiled with NVRTC on first use and
cached on disk (``GDNJIT_CACHE_DIR``); precompile with ``gdnjit warm --shapes qwen35.yaml``.
"""

from .errors import CacheMissError, CompileError, ContractError, CudaError, DtypeError, LockTimeoutError, SpecError
from .version import __version__

# The ops import torch; load them on first use so the CLI (warm, cache) starts fast.
_LAZY = {
    "gated_delta_rule_decode_pretranspose": "gdn",
    "gated_delta_rule_decode": "gdn",
    "gated_delta_rule_mtp": "gdn",
    "nvfp4_quantize": "nvfp4",
    "fp4_quantize": "nvfp4",
    "dequantize_nvfp4": "nvfp4",
    "SfLayout": "nvfp4",
    "causal_conv1d_update": "conv",
    "gated_delta_rule_replayssm_commit": "replay",
    "gated_delta_rule_spec_step": "spec_step",
    "gated_delta_rule_spec_flush": "spec_step",
    "SpecCache": "spec_step",
    "spec_cache": "spec_step",
    "gated_delta_rule_lazy_step": "lazy",
    "gated_delta_rule_lazy_fold": "lazy",
    "gated_delta_rule_lazy_reset": "lazy",
    "LazyCache": "lazy",
    "lazy_cache": "lazy",
    "gated_delta_rule_mtp_ucache": "ucache",
    "gated_delta_rule_mtp_ucache_flush": "ucache",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gdnjit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))

__all__ = [
    "gated_delta_rule_decode_pretranspose",
    "gated_delta_rule_decode",
    "gated_delta_rule_mtp",
    "nvfp4_quantize",
    "fp4_quantize",
    "dequantize_nvfp4",
    "SfLayout",
    "causal_conv1d_update",
    "gated_delta_rule_replayssm_commit",
    "gated_delta_rule_spec_step",
    "gated_delta_rule_spec_flush",
    "SpecCache",
    "spec_cache",
    "gated_delta_rule_lazy_step",
    "gated_delta_rule_lazy_fold",
    "gated_delta_rule_lazy_reset",
    "LazyCache",
    "lazy_cache",
    "gated_delta_rule_mtp_ucache",
    "gated_delta_rule_mtp_ucache_flush",
    "CacheMissError",
    "CompileError",
    "ContractError",
    "CudaError",
    "DtypeError",
    "LockTimeoutError",
    "SpecError",
    "__version__",
]
