"""Harness stand-in for ``flashinfer.gdn_kernels``.

Only the kernel modules FlashInfer's tests call as a second implementation are
provided, as adapters onto gdnjit (:mod:`.gdn_decode_bf16_state`,
:mod:`.gdn_decode_bf16_wy_output_only`) or as gdnjit's functions themselves
(the u-cache calls, :mod:`.gdn_decode_bf16_wy_ucache` and
:mod:`.gdn_decode_bf16_wy_ucache_flush`, exported here as FlashInfer does).
FlashInfer's CuTe-DSL internals (compile caches, ``run_pretranspose_decode``)
are not: see :mod:`.gdn_decode_pretranspose`.
"""

# As in FlashInfer: a u-cache module that cannot be imported leaves its name None (the other stand-ins still load).
try:
    from .gdn_decode_bf16_wy_ucache import gated_delta_rule_mtp_ucache
except (ImportError, RuntimeError):
    gated_delta_rule_mtp_ucache = None  # type: ignore

try:
    from .gdn_decode_bf16_wy_ucache_flush import gated_delta_rule_mtp_ucache_flush
except (ImportError, RuntimeError):
    gated_delta_rule_mtp_ucache_flush = None  # type: ignore

__all__ = ["gated_delta_rule_mtp_ucache", "gated_delta_rule_mtp_ucache_flush"]
