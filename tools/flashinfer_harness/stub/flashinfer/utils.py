"""Harness stand-in for ``flashinfer.utils``: architecture checks and ``round_up``.

Deliberate difference from FlashInfer: ``is_sm100a_supported`` answers "can gdnjit's
NVFP4 kernel run here" (compute capability >= 8.9, so H100 counts), because the FP4
tests gate on ``is_sm100a or is_sm110a or is_sm12x`` and the harness exists to run
those cases on gdnjit. The other checks report the real architecture.
"""

from __future__ import annotations

from typing import Tuple

import torch

# gdnjit's NVFP4 kernel needs the e4m3 conversions of compute capability 8.9+ (gdnjit/nvfp4.py).
_GDNJIT_NVFP4_MIN_CC = (8, 9)


def get_compute_capability(device: torch.device) -> Tuple[int, int]:
    """(major, minor) of a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("device must be a cuda device")
    return torch.cuda.get_device_capability(device)


def is_sm100a_supported(device: torch.device) -> bool:
    """Harness meaning: True where gdnjit's NVFP4 quantizer runs (compute capability >= 8.9)."""
    return get_compute_capability(device) >= _GDNJIT_NVFP4_MIN_CC


def is_sm110a_supported(device: torch.device) -> bool:
    return get_compute_capability(device)[0] == 11


def is_sm12x_supported(device: torch.device) -> bool:
    return get_compute_capability(device)[0] == 12


def round_up(x: int, y: int) -> int:
    """x rounded up to a multiple of y."""
    return (x + y - 1) // y * y
