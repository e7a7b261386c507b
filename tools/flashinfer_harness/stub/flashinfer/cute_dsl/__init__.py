"""Harness stand-in for ``flashinfer.cute_dsl``.

There is no CuTe DSL here. gdnjit accepts FlashInfer's backend name ``"cute-dsl"`` for
its NVFP4 quantizer and runs its own JIT kernel for it (the same kernel as ``"cuda"``),
so ``is_cute_dsl_available()`` reports True and the tests' cute-dsl cases run on gdnjit.
Caveat: "cuda vs cute-dsl" parity cases then compare gdnjit with itself.
Set ``FI_HARNESS_CUTE_DSL=0`` to report it unavailable instead (those cases skip).
"""

import os

from .utils import is_cute_dsl_arch_supported


def is_cute_dsl_available() -> bool:
    return os.environ.get("FI_HARNESS_CUTE_DSL", "1") != "0"


__all__ = ["is_cute_dsl_available", "is_cute_dsl_arch_supported"]
