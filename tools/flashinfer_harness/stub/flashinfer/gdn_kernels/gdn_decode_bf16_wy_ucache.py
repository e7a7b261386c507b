"""Harness stand-in for ``flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache``: gdnjit's function itself.

``gated_delta_rule_mtp_ucache`` is :func:`gdnjit.ucache.gated_delta_rule_mtp_ucache` (FlashInfer 0.7.2.post1's
verify-only call: a flat 16-row ring, the checkpoint never written). FlashInfer's test file loads this module by
path (``<fi_tests_dir>/flashinfer/gdn_kernels/...``, which run.sh links to this stand-in). FlashInfer's module is
bf16 only; gdnjit takes the dtypes from the tensors (bf16 or fp16 inputs, any state / ring dtype it has), so a
call FlashInfer refuses for its dtypes may run here. ``K_DIM``, ``V_DIM_C`` and ``W_RING`` are FlashInfer's
constants.
"""

from __future__ import annotations

import torch

from gdnjit.ucache import gated_delta_rule_mtp_ucache

IO_TORCH = torch.bfloat16
K_DIM = 128
V_DIM_C = 128
W_RING = 16

__all__ = ["gated_delta_rule_mtp_ucache", "IO_TORCH", "K_DIM", "V_DIM_C", "W_RING"]
