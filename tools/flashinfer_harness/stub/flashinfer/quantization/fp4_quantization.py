"""Harness stand-in for ``flashinfer.quantization.fp4_quantization``.

``NVFP4_QUANT_ENV_VARS`` lists the environment variables FlashInfer's NVFP4
quantizers read per call (the tests' fixture clears and sets them). gdnjit
reads them itself, per call, as FlashInfer does: the fast-math switch and the
4over6 recipe (``gdnjit.nvfp4.four_over_six_from_env``).
"""

from gdnjit.nvfp4 import SfLayout, fp4_quantize, nvfp4_quantize

from .._harness_fp4 import block_scale_interleave, e2m1_and_ufp8sf_scale_to_float

NVFP4_QUANT_ENV_VARS = (
    "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH",  # "1": the exact (TransformerEngine) recipe
    "FLASHINFER_NVFP4_4OVER6",                 # "1": 4over6 recipe on
    "FLASHINFER_NVFP4_4OVER6_ERR_MODE",        # "MAE" / "MSE"
    "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH",
    "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256",
)

__all__ = ["NVFP4_QUANT_ENV_VARS", "SfLayout", "fp4_quantize", "nvfp4_quantize", "block_scale_interleave",
           "e2m1_and_ufp8sf_scale_to_float"]
