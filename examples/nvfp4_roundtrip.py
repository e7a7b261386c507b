"""NVFP4 round trip: quantize activations with gdnjit's kernel, dequantize, report the error.

For each scale-factor layout: quantize ``x [M, K]`` with the recipe global scale
``gs = 448 * 6 / amax(x)`` (a device tensor: no host sync, CUDA-graph safe), check that the packed
codes and the scale bytes are bit-identical to the package's torch reference, dequantize and report
the relative error, the signal-to-noise ratio and the worst block error relative to its block's
maximum. Prints OK at the end (exit status 1 otherwise).

    python examples/nvfp4_roundtrip.py
    python examples/nvfp4_roundtrip.py --m 4096 --k 7168 --dtype fp16
    python examples/nvfp4_roundtrip.py --device cpu     # no GPU: the torch reference backend
"""

from __future__ import annotations

import argparse
import math
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--m", type=int, default=1000, help="rows M (tokens)")
    p.add_argument("--k", type=int, default=4096, help="row length K (a multiple of 16 with a kernel variant)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--layouts", nargs="+", default=["128x4", "8x4", "linear"], choices=("128x4", "8x4", "linear"))
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (reference backend)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    import gdnjit
    from gdnjit.reference.nvfp4 import quantize_reference

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    backend = "gdnjit" if device.type == "cuda" else "reference"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    gen = torch.Generator(device=device).manual_seed(args.seed)
    M, K = args.m, args.k
    # activations with outliers: per-row scales over 3 decades, a few large spikes
    x = torch.randn(M, K, generator=gen, device=device) * torch.exp(torch.randn(M, 1, generator=gen, device=device))
    spikes = torch.rand(M, K, generator=gen, device=device) < 1e-3
    x = torch.where(spikes, x * 20, x).to(dtype)
    gs = (448.0 * 6.0 / x.float().abs().amax()).reshape(1)
    print(f"x [{M}, {K}] {args.dtype} on {device} (backend {backend}), global scale {gs.item():.4g}")
    print(f"{'layout':>7}  {'sf shape':>12}  {'bytes':>9}  {'rel err':>8}  {'SNR dB':>7}  {'worst block':>11}  exact")

    failures = []
    xf = x.float()
    for layout in args.layouts:
        fp4, sf = gdnjit.nvfp4_quantize(x, gs, layout, backend=backend)
        y = gdnjit.dequantize_nvfp4(fp4, sf, gs, layout)  # float32 [M, K]
        rfp4, rsf = quantize_reference(x, gs, layout)
        exact = torch.equal(fp4, rfp4) and torch.equal(sf, rsf)
        err = y - xf
        rel = (err.norm() / xf.norm()).item()
        snr = -20 * math.log10(max(rel, 1e-30))
        block_max = xf.abs().view(M, K // 16, 16).amax(-1).clamp_min(1e-30)
        worst_block = (err.abs().view(M, K // 16, 16).amax(-1) / block_max).max().item()
        nbytes = fp4.numel() + sf.numel()
        print(f"{layout:>7}  {str(tuple(sf.shape)):>12}  {nbytes:>9}  {rel:8.4f}  {snr:7.2f}  {worst_block:11.4f}  "
              f"{'yes' if exact else 'NO'}")
        if not exact:
            failures.append(f"{layout}: kernel output differs from the torch reference")
        if fp4.shape != (M, K // 2) or fp4.dtype != torch.uint8:
            failures.append(f"{layout}: fp4 shape {tuple(fp4.shape)} dtype {fp4.dtype}")
        if not rel < 0.15:  # 4-bit values with one e4m3 scale per 16: ~0.1 on Gaussian-like data
            failures.append(f"{layout}: relative error {rel:.3f} is too large for NVFP4")
    print(f"{x.numel() * x.element_size()} input bytes -> {M * K // 2} bytes of codes + "
          f"{M * K // 16} scale bytes (+ layout padding)")
    if failures:
        print("FAILED\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
