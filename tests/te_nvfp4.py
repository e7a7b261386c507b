"""TransformerEngine's NVFP4 formula, written from its description (docs/design.md section 5), independently of
gdnjit.reference.nvfp4: the oracle of the exact recipe (FlashInfer's FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1).

Per 16-element block, float32 throughout: decode scale = e4m3(clamp(amax * (gs * fp32(1/6)), +-448)); encode
scale = min(1 / (float(decode) * (1 / gs)), FLT_MAX); value = clamp(x * encode, -6, 6) rounded to the e2m1 grid,
ties to even; the code's sign bit is x's sign bit.
"""

from __future__ import annotations

import torch

from gdnjit.sf_layout import padded_sf_shape, sf_offsets

_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Magnitude codes of |y| <= 6: the nearest grid point, ties to the even code (distance comparison)."""
    mag = y.abs().unsqueeze(-1)
    grid = _GRID.to(y.device)
    dist = (mag - grid).abs()
    best = dist.min(dim=-1, keepdim=True).values
    # among the nearest points (one, or two at a tie) take the even code
    candidates = (dist == best)
    idx = torch.arange(8, device=y.device)
    even_first = torch.where(candidates, (idx % 2) * 8 + idx, torch.full_like(idx, 99))
    return (even_first.argmin(dim=-1)).to(torch.uint8)


def te_quantize(x: torch.Tensor, gs: torch.Tensor, layout):
    """(fp4 [M, K // 2], sf in ``layout``) of a 2-D fp16 / bf16 tensor with a float32 global encode scale."""
    M, K = x.shape
    n = K // 16
    xf = x.float().view(M, n, 16)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    gs = gs.float().reshape(()).to(x.device)
    sixth = torch.tensor(1.0, device=x.device) / 6.0
    decode = torch.clamp(amax * (gs * sixth), -448.0, 448.0).to(torch.float8_e4m3fn)
    inv_gs = torch.tensor(1.0, device=x.device) / gs
    flt_max = torch.tensor(torch.finfo(torch.float32).max, device=x.device)
    encode = torch.minimum(torch.tensor(1.0, device=x.device) / (decode.float() * inv_gs), flt_max)
    y = torch.clamp(xf * encode, -6.0, 6.0)
    codes = _e2m1_codes(y) | (torch.signbit(xf).to(torch.uint8) << 3)
    codes = codes.view(M, K // 2, 2)
    fp4 = codes[..., 0] | (codes[..., 1] << 4)
    rows, cols = padded_sf_shape(M, n, layout)
    sf = torch.zeros(rows * cols, dtype=torch.uint8, device=x.device)
    sf[sf_offsets(M, n, layout, device=x.device).view(-1)] = decode.view(torch.uint8).reshape(-1)
    return fp4, sf.view(rows, cols)
