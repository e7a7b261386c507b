"""Non-kernel FP4 helpers of the harness stand-in, written for this harness in torch.

The scale-factor layouts are spelled out here from the layout definitions
(rather than taken from gdnjit), so the tests that compare gdnjit's swizzled
scales with :func:`block_scale_interleave` or dequantize them check gdnjit
against an independent spelling of the layout.

Byte offset of the scale of (row r, block column c) in a buffer with
``cols_p = round_up(n_blocks, 4)`` columns:

* 128x4: ``(r // 128) * 128 * cols_p + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``
* 8x4:   ``(r // 8) * 8 * cols_p + (c // 4) * 32 + (r % 8) * 4 + c % 4``
* linear: ``r * n_blocks + c``
"""

from __future__ import annotations

from typing import Optional

import torch

# e2m1 code -> value; bit 3 is the sign.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def not_provided(name: str, what: str):
    """A FlashInfer entry point gdnjit has no counterpart for: raises NotImplementedError when called."""

    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"flashinfer.{name}: {what} is a FlashInfer feature that gdnjit does not provide "
            "(tools/flashinfer_harness stand-in)")

    fn.__name__ = name
    fn.__doc__ = f"Not provided by gdnjit ({what}); raises NotImplementedError."
    return fn


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _sf_offsets(rows: int, n_blocks: int, layout: str, device) -> torch.Tensor:
    r = torch.arange(rows, dtype=torch.int64, device=device)[:, None]
    c = torch.arange(n_blocks, dtype=torch.int64, device=device)[None, :]
    cols_p = _round_up(n_blocks, 4)
    if layout == "128x4":
        return (r // 128) * (128 * cols_p) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    if layout == "8x4":
        return (r // 8) * (8 * cols_p) + (c // 4) * 32 + (r % 8) * 4 + c % 4
    return r * n_blocks + c


def block_scale_interleave(unswizzled_sf: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rewrite linear scales ``[rows, cols]`` (or ``[E, rows, cols]``) into the 128x4 swizzled layout.

    Rows are padded to 128 and columns to 4 with zeros; returns the flat buffer
    ``[E * round_up(rows, 128) * round_up(cols, 4)]`` (E = 1 for 2-D input), like FlashInfer.
    """
    assert unswizzled_sf.dtype in (torch.uint8, torch.bfloat16), (
        f"Input dtype must be uint8 or bfloat16, got {unswizzled_sf.dtype}")
    x = unswizzled_sf if unswizzled_sf.dim() == 3 else unswizzled_sf.reshape(1, *unswizzled_sf.shape[-2:])
    experts, rows, cols = x.shape
    rows_p, cols_p = _round_up(rows, 128), _round_up(cols, 4)
    padded = torch.zeros((experts, rows_p, cols_p), dtype=x.dtype, device=x.device)
    padded[:, :rows, :cols] = x
    # (E, row tile, (r % 128) // 32, r % 32, column tile, c % 4) -> (E, row tile, column tile, r % 32, (r % 128) // 32, c % 4)
    tiles = padded.view(experts, rows_p // 128, 4, 32, cols_p // 4, 4).permute(0, 1, 4, 3, 2, 5)
    flat = tiles.reshape(-1)
    if out is not None:
        if out.shape != flat.shape or out.dtype != flat.dtype or out.device != flat.device or not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous flat tensor of shape {tuple(flat.shape)}, "
                             f"dtype {flat.dtype}, on {flat.device}")
        out.copy_(flat)
        return out
    return flat


def e2m1_and_ufp8sf_scale_to_float(
    e2m1_tensor: torch.Tensor,
    ufp8_scale_tensor: torch.Tensor,
    global_scale_tensor: Optional[torch.Tensor] = None,
    sf_vec_size: int = 16,
    ufp8_type: int = 1,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
) -> torch.Tensor:
    """Dequantize packed e2m1 ``[M, K/2]`` (element 2i in the low nibble) with one scale per
    ``sf_vec_size`` elements: ``value = e2m1 * sf * global_scale``.

    ``ufp8_type``: 1 = E4M3 scales, 0 = UE8M0 (``2 ** (byte - 127)``). ``global_scale_tensor`` is the
    *decode* scale (1 / encode scale), None = 1. Scales are read from the flat buffer in the 128x4
    (or 8x4) swizzled layout, or linear. Returns float32 ``[M, K]`` on the CPU, as FlashInfer's host op.
    """
    if e2m1_tensor.dim() != 2:
        raise ValueError(f"e2m1_tensor: expected [M, K/2], got shape {tuple(e2m1_tensor.shape)}")
    if is_sf_8x4_layout and not is_sf_swizzled_layout:
        raise ValueError("is_sf_8x4_layout=True needs is_sf_swizzled_layout=True")
    device = e2m1_tensor.device
    packed = e2m1_tensor.view(torch.uint8) if e2m1_tensor.dtype != torch.uint8 else e2m1_tensor
    m, k = packed.shape[0], packed.shape[1] * 2
    if k % sf_vec_size:
        raise ValueError(f"K={k} is not a multiple of sf_vec_size={sf_vec_size}")
    n_blocks = k // sf_vec_size
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(m, k).long()
    values = torch.tensor(_E2M1, dtype=torch.float32, device=device)[codes]

    sf = ufp8_scale_tensor.to(device)
    sf = (sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf).reshape(-1)
    layout = "linear" if not is_sf_swizzled_layout else ("8x4" if is_sf_8x4_layout else "128x4")
    offsets = _sf_offsets(m, n_blocks, layout, device)
    if m and n_blocks and int(offsets.max()) >= sf.numel():
        raise ValueError(f"ufp8_scale_tensor: {sf.numel()} bytes, too few for [{m}, {n_blocks}] scales "
                         f"in the {layout} layout")
    sf_bytes = sf[offsets.reshape(-1)].reshape(m, n_blocks)
    if ufp8_type == 1:
        scales = sf_bytes.view(torch.float8_e4m3fn).float()
    elif ufp8_type == 0:
        scales = torch.exp2(sf_bytes.float() - 127.0)
    else:
        raise ValueError(f"ufp8_type: expected 0 (UE8M0) or 1 (E4M3), got {ufp8_type!r}")
    result = values * scales.repeat_interleave(sf_vec_size, dim=1)
    if global_scale_tensor is not None:
        gs = global_scale_tensor
        gs = gs.to(device=device, dtype=torch.float32).reshape(-1)[0] if isinstance(gs, torch.Tensor) else float(gs)
        result = result * gs
    return result.cpu()


def silu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None, enable_pdl=None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` computed in fp32, rounded to the input dtype (a test reference only)."""
    d = input.shape[-1] // 2
    y = (torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
