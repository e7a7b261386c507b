"""Test-harness stand-in for the ``flashinfer`` package (NOT FlashInfer).

It exists only so FlashInfer's own test files can run against gdnjit
(``tools/flashinfer_harness/run.sh``). It provides exactly the names those
tests, their helpers and conftest import:

* every GDN / FP4 kernel entry point is gdnjit's function itself
  (``fp4_quantize``, ``nvfp4_quantize``, ``SfLayout`` here; the GDN ones in
  :mod:`flashinfer.gdn_decode` and :mod:`flashinfer.gdn_kernels`);
* non-kernel helpers (dequantization, scale-factor interleave, arch checks,
  4over6 config, env-var names) are small torch implementations written for
  this harness (:mod:`flashinfer._harness_fp4`, :mod:`flashinfer.utils`);
* FlashInfer-only features gdnjit does not provide (MXFP4, batched / grouped /
  fused-SiLU NVFP4 quantization) raise ``NotImplementedError`` naming the
  feature, so their tests fail with that reason instead of passing.
"""

from gdnjit.nvfp4 import SfLayout, fp4_quantize, nvfp4_quantize

from ._harness_fp4 import block_scale_interleave, e2m1_and_ufp8sf_scale_to_float, not_provided, silu_and_mul

mxfp4_quantize = not_provided("mxfp4_quantize", "MXFP4 (UE8M0 scales, 32-element blocks)")
mxfp4_dequantize = not_provided("mxfp4_dequantize", "MXFP4 (UE8M0 scales, 32-element blocks)")
nvfp4_batched_quantize = not_provided("nvfp4_batched_quantize", "batched NVFP4 quantization")
scaled_fp4_grouped_quantize = not_provided("scaled_fp4_grouped_quantize", "masked grouped NVFP4 quantization")
silu_and_mul_nvfp4_quantize = not_provided("silu_and_mul_nvfp4_quantize", "fused SiLU-and-mul + NVFP4 quantization")
silu_and_mul_scaled_nvfp4_experts_quantize = not_provided(
    "silu_and_mul_scaled_nvfp4_experts_quantize", "fused SiLU-and-mul + per-expert NVFP4 quantization")

__all__ = [
    "SfLayout", "fp4_quantize", "nvfp4_quantize", "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float",
    "silu_and_mul", "mxfp4_quantize", "mxfp4_dequantize", "nvfp4_batched_quantize", "scaled_fp4_grouped_quantize",
    "silu_and_mul_nvfp4_quantize", "silu_and_mul_scaled_nvfp4_experts_quantize",
]
