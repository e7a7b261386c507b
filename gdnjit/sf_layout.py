"""Layouts of the NVFP4 scale-factor (SF) buffer, with FlashInfer-compatible names.

An ``[M, K]`` tensor quantized to NVFP4 has one e4m3 scale factor per 16-element block,
so ``n_blocks = K // 16`` per row. The SF buffer is a flat ``uint8`` buffer of
``padded_rows * padded_cols`` bytes; :func:`sf_offsets` says where the scale of
(row ``r``, block column ``c``) lives in it. Positions that no (r, c) maps to are padding.

``layout_128x4`` (the swizzled layout tcgen05 / cuBLASLt block-scaled GEMMs read):
    rows padded to a multiple of 128, columns to a multiple of 4;
    ``offset = (c % 4) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
    + (r // 128) * (128 * padded_cols)``.
``layout_8x4``:
    rows padded to a multiple of 8, columns to a multiple of 4;
    ``offset = (r // 8) * (num_k_tiles * 32) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)``
    with ``num_k_tiles = padded_cols // 4``.
``layout_linear``:
    row-major ``r * n_blocks + c``, no padding.
"""

from __future__ import annotations

import enum
import operator

import torch


class SfLayout(enum.IntEnum):
    """Scale-factor buffer layout (values match FlashInfer's ``SfLayout``)."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


_NAMES = {
    "128x4": SfLayout.layout_128x4,
    "8x4": SfLayout.layout_8x4,
    "linear": SfLayout.layout_linear,
}


def to_sf_layout(layout) -> SfLayout:
    """Normalise a layout given as :class:`SfLayout`, its int value or its name.

    Accepted names (case-insensitive): ``'128x4'``, ``'8x4'``, ``'linear'`` and the
    member names ``'layout_128x4'``, ``'layout_8x4'``, ``'layout_linear'``.

    Raises:
        ValueError: naming ``sfLayout`` when the value is none of these (bools are refused).
    """
    if isinstance(layout, SfLayout):
        return layout
    if isinstance(layout, int) and not isinstance(layout, bool):
        try:
            return SfLayout(layout)
        except ValueError:
            pass
    elif isinstance(layout, str):
        key = layout.strip().lower()
        key = key[len("layout_"):] if key.startswith("layout_") else key
        if key in _NAMES:
            return _NAMES[key]
    raise ValueError(
        f"sfLayout: expected an SfLayout, one of the ints 0/1/2 or one of the names "
        f"'128x4', '8x4', 'linear' (or 'layout_128x4', ...), got {layout!r}"
    )


def _nonneg_int(value, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a non-negative int, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected a non-negative int, got {value!r}") from None
    if v < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {v}")
    return v


def _round_up(x: int, mult: int) -> int:
    return (x + mult - 1) // mult * mult


def padded_sf_shape(m: int, n_blocks: int, layout=SfLayout.layout_128x4) -> tuple[int, int]:
    """Shape ``(padded_rows, padded_cols)`` of the SF buffer for ``m`` rows of ``n_blocks`` blocks.

    ``128x4``: ``(round_up(m, 128), round_up(n_blocks, 4))``; ``8x4``:
    ``(round_up(m, 8), round_up(n_blocks, 4))``; ``linear``: ``(m, n_blocks)``.

    Raises:
        TypeError / ValueError: ``m`` or ``n_blocks`` is not a non-negative int.
        ValueError: naming ``sfLayout`` for an unknown layout.
    """
    m = _nonneg_int(m, "m")
    n_blocks = _nonneg_int(n_blocks, "n_blocks")
    layout = to_sf_layout(layout)
    if layout == SfLayout.layout_128x4:
        return _round_up(m, 128), _round_up(n_blocks, 4)
    if layout == SfLayout.layout_8x4:
        return _round_up(m, 8), _round_up(n_blocks, 4)
    return m, n_blocks


def sf_offsets(m: int, n_blocks: int, layout=SfLayout.layout_128x4, device=None) -> torch.Tensor:
    """Flat byte offset of each (row, block column) scale in the padded SF buffer.

    Returns:
        int64 tensor ``[m, n_blocks]`` (on ``device``, default CPU); entry ``[r, c]`` is the
        index into the flat buffer of ``padded_rows * padded_cols`` bytes (see
        :func:`padded_sf_shape`). The map is injective; the positions it misses are padding.

    Raises:
        same as :func:`padded_sf_shape`.
    """
    m = _nonneg_int(m, "m")
    n_blocks = _nonneg_int(n_blocks, "n_blocks")
    layout = to_sf_layout(layout)
    _, padded_cols = padded_sf_shape(m, n_blocks, layout)
    r = torch.arange(m, dtype=torch.int64, device=device).unsqueeze(1)
    c = torch.arange(n_blocks, dtype=torch.int64, device=device).unsqueeze(0)
    if layout == SfLayout.layout_128x4:
        off = (c % 4) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
        off = off + (r // 128) * (128 * padded_cols)
    elif layout == SfLayout.layout_8x4:
        num_k_tiles = padded_cols // 4
        off = (r // 8) * (num_k_tiles * 32) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)
    else:
        off = r * n_blocks + c
    return off.expand(m, n_blocks).contiguous()
