"""Harness stand-in for ``flashinfer.gdn_kernels``.

Only the kernel modules FlashInfer's tests call as a second implementation are
provided, as adapters onto gdnjit (:mod:`.gdn_decode_bf16_state`,
:mod:`.gdn_decode_bf16_wy_output_only`). FlashInfer's CuTe-DSL internals
(compile caches, ``run_pretranspose_decode``) are not: see
:mod:`.gdn_decode_pretranspose`.
"""
