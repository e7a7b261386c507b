"""Harness stand-in for ``flashinfer.quantization.nvfp4_quantization_utils``.

Only the 4over6 recipe description the tests and ``tests/test_helpers/utils_fp4.py``
use: a frozen config dataclass, its error-metric enum and the E4M3 scale bound it
implies. gdnjit's ``nvfp4_4over6`` argument takes this config by its fields (``e4m3_max``, ``err_mode``,
``err_use_fast_math``), as it takes FlashInfer's own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

E4M3_MAX = 448.0  # largest finite float8_e4m3fn value


class NVFP44Over6ErrMode(enum.IntEnum):
    """How 4over6 scores its two candidate block scales: sum of |err| or of err^2."""

    MAE = 0
    MSE = 1


@dataclass(frozen=True)
class NVFP44Over6Config:
    """A 4over6 recipe: the E4M3 bound (256 or 448), the error metric and whether
    the error is evaluated in fp16. ``err_mode`` may be given as "MAE"/"MSE" or 0/1
    and is stored as :class:`NVFP44Over6ErrMode`."""

    e4m3_max: int = 448
    err_mode: Union[NVFP44Over6ErrMode, str] = NVFP44Over6ErrMode.MAE
    err_use_fast_math: bool = False

    def __post_init__(self) -> None:
        if self.e4m3_max not in (256, 448):
            raise ValueError(f"e4m3_max: expected 256 or 448, got {self.e4m3_max!r}")
        mode = self.err_mode
        try:
            mode = NVFP44Over6ErrMode[mode.upper()] if isinstance(mode, str) else NVFP44Over6ErrMode(mode)
        except (KeyError, ValueError):
            raise ValueError(f"err_mode: expected MAE or MSE, got {self.err_mode!r}") from None
        object.__setattr__(self, "err_mode", mode)

    @property
    def err_mode_name(self) -> str:
        return self.err_mode.name


def nvfp4_e4m3_max(nvfp4_4over6_config: Optional[NVFP44Over6Config] = None) -> float:
    """The E4M3 block-scale bound of a recipe: 448 for standard NVFP4 (None)."""
    return E4M3_MAX if nvfp4_4over6_config is None else float(nvfp4_4over6_config.e4m3_max)


__all__ = ["NVFP44Over6ErrMode", "NVFP44Over6Config", "nvfp4_e4m3_max"]
