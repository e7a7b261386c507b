"""Harness stand-in for ``flashinfer.cute_dsl.utils``."""


def is_cute_dsl_arch_supported(major: int, minor: int, native_only: bool = False) -> bool:
    """Harness meaning: True where gdnjit's GDN kernels run (compute capability 9.0+).

    FlashInfer's GDN test modules skip themselves when this is False; gdnjit runs there.
    """
    return int(major) >= 9
