"""Harness stand-in for ``flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush``: gdnjit's function itself.

``gated_delta_rule_mtp_ucache_flush`` is :func:`gdnjit.ucache.gated_delta_rule_mtp_ucache_flush` (FlashInfer
0.7.2.post1's signature and cursor semantics over gdnjit's lazy-state kernel). FlashInfer's test file loads this
module by path (``<fi_tests_dir>/flashinfer/gdn_kernels/...``, which run.sh links to this stand-in), once per dtype
arm, with ``GDN_UCACHE_IO_DTYPE`` / ``GDN_UCACHE_STATE_DTYPE`` / ``GDN_UCACHE_RING_DTYPE`` set. FlashInfer compiles
one dtype set per module load from them; gdnjit takes the dtypes from the tensors, so here they only set the module
constants ``IO_TORCH``, ``ST_TORCH`` and ``RING_TORCH`` (FlashInfer's names; the tests read them), and nothing is
checked against them. ``K_DIM``, ``V_DIM_C``, ``W_RING``, ``RING_SLOTS`` and ``RING_MASK`` are FlashInfer's
constants (gdnjit also runs K, V in {64, 256}).
"""

from __future__ import annotations

import os

import torch

from gdnjit.ucache import gated_delta_rule_mtp_ucache_flush

_NAMES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}


def _env_dtype(name: str, default: torch.dtype) -> torch.dtype:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in _NAMES:
        raise ValueError(f"{name}={value!r} unsupported: use 'bf16' or 'fp16' (tools/flashinfer_harness stand-in)")
    return _NAMES[value]


IO_TORCH = _env_dtype("GDN_UCACHE_IO_DTYPE", torch.bfloat16)
ST_TORCH = _env_dtype("GDN_UCACHE_STATE_DTYPE", IO_TORCH)
RING_TORCH = _env_dtype("GDN_UCACHE_RING_DTYPE", IO_TORCH)
K_DIM = 128
V_DIM_C = 128
W_RING = 16
RING_SLOTS = 32
RING_MASK = RING_SLOTS - 1

__all__ = ["gated_delta_rule_mtp_ucache_flush", "IO_TORCH", "ST_TORCH", "RING_TORCH", "K_DIM", "V_DIM_C", "W_RING",
           "RING_SLOTS", "RING_MASK"]
