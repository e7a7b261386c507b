"""Harness stand-in for ``flashinfer.fp4_quantization`` (a re-export module in FlashInfer too)."""

from gdnjit.nvfp4 import SfLayout, fp4_quantize, nvfp4_quantize

from ._harness_fp4 import block_scale_interleave, e2m1_and_ufp8sf_scale_to_float

__all__ = ["SfLayout", "fp4_quantize", "nvfp4_quantize", "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float"]
