"""Harness stand-in: FlashInfer's CuTe-DSL pretranspose kernel module is not provided.

Its tests reach into FlashInfer internals (``_get_compiled_decode_kernel`` cache keys,
``cute.compile`` call counts, ``run_pretranspose_decode``) that have no gdnjit
counterpart. Importing this module raises ImportError, which FlashInfer's tests turn
into a skip with this message.
"""

raise ImportError("flashinfer.gdn_kernels.gdn_decode_pretranspose: FlashInfer's CuTe-DSL kernel internals "
                  "(compile cache, run_pretranspose_decode) have no gdnjit counterpart "
                  "(tools/flashinfer_harness stand-in)")
