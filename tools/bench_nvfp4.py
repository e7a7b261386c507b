"""Benchmark gdnjit's NVFP4 activation quantization against the torch reference (eager and torch.compile).

Usage (GPU machine, repo root as working dir)::

    python3 tools/bench_nvfp4.py --out $OUT
    python3 tools/bench_nvfp4.py --quick --out $OUT
    python3 tools/bench_nvfp4.py --m 1 128 4096 --k 7168 --layouts 128x4 8x4 --dtype fp16
    python3 tools/bench_nvfp4.py --mode token-4over6 --no-compile --out $OUT

Grid (defaults): M in {128, 1024, 4096, 8192, 16384} x K in {2048, 4096, 7168, 8192}, bf16 input,
128x4 scale layout, global scale as a one-element device tensor. ``--quick``: M in {128, 4096, 16384},
K in {2048, 7168}, fewer repetitions (explicit --m / --k still win).

Columns, per (layout, M, K):

* bytes: input read + packed e2m1 written (M*K/2) + scale buffer written (padded rows x cols).
* gdnjit: device µs per call from CUDA-graph replays (``bench_common.time_graph``, median), the
  achieved bandwidth bytes / time, and its fraction of the copy bandwidth measured at the start of
  the same run (``bench_common.copy_bandwidth``: 1 GiB device-to-device copy, read + write counted).
  ``eager``: per-call wall time of back-to-back eager calls (``time_eager``), host cost included.
* no-PDL: the same calls with ``enable_pdl=False`` (the default, None, uses programmatic dependent
  launch on sm_90+: each captured call may be scheduled while the previous one finishes).
* same-size copy: the same bytes (half read, half written) through an SM copy kernel
  (``torch.mul(x, 1, out=y)``), same rotation and timing, and its fraction of the copy bandwidth:
  the launch, ramp-up and tail cost that any kernel of this size pays.
* ref: the torch reference (``gdnjit.reference.nvfp4.quantize_reference``) eager, event-timed single
  calls (it reads the global scale on the host, so it cannot be graph-captured).
* compiled: the reference's tensor math (same ops, global scale kept on the device) under
  ``torch.compile``, graph-replayed when capturable (else event-timed; noted). A torch.compile
  failure leaves the column empty with a note.
* exact: gdnjit's bytes equal the reference's on input set 0 (checked before timing).

``--mode``: ``plain`` (one global scale, the default), ``4over6`` (FlashInfer's 4over6 search, MAE), ``token``
(per-token activation scales: one CTA per row; bytes add the per-token scales written), ``token-4over6`` (both).
The compiled column is the plain recipe's only (other modes: ``--no-compile``).

Rotation: each row allocates ``sets`` input sets so that inputs + outputs of one rotation are >= 3x L2
(outputs are allocated by each call and rotate with the graph's ring of results); rows whose working
set still fits twice in L2 are flagged ``L2``. Inputs are random normal with log-uniform block scales
(never zeros).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, last

import bench_common as bc  # noqa: E402
from gdnjit.reference.nvfp4 import e2m1_satfinite_rne, e4m3_decode, e4m3_satfinite_rne  # noqa: E402

GB = 1e9
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
# --mode: (per-token scales, 4over6) of each
MODES = {"plain": (False, False), "4over6": (False, True), "token": (True, False), "token-4over6": (True, True)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--m", type=int, nargs="+", help="rows M [128 1024 4096 8192 16384]")
    p.add_argument("--k", type=int, nargs="+", help="row lengths K [2048 4096 7168 8192]")
    p.add_argument("--layouts", nargs="+", default=["128x4"], help="scale layouts: 128x4 8x4 linear")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--quick", action="store_true", help="smaller grid, fewer repetitions")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument("--no-ref", action="store_true", help="skip the eager reference column")
    p.add_argument("--out", metavar="DIR", help="write results.json and results.md into DIR")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mem-cap-gb", type=float, default=16.0, help="memory for the rotated input sets")
    p.add_argument("--l2-factor", type=float, default=3.0, help="rotate until sets cover this x L2")
    p.add_argument("--replays", type=int, help="graph replays [50, quick: 20]")
    p.add_argument("--mode", default="plain", choices=sorted(MODES), help="what to quantize (see above)")
    args = p.parse_args(argv)
    if args.mode != "plain" and not args.no_compile:
        p.error("--mode other than plain: the compiled column is the plain recipe's; pass --no-compile")
    args.m = args.m or ([128, 4096, 16384] if args.quick else [128, 1024, 4096, 8192, 16384])
    args.k = args.k or ([2048, 7168] if args.quick else [2048, 4096, 7168, 8192])
    args.replays = args.replays or (20 if args.quick else 50)
    return args


def make_input(M: int, K: int, dtype: torch.dtype, device, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K // 16, 16, generator=g, device=device)
    x = x * torch.exp2(torch.randint(-8, 9, (M, K // 16, 1), generator=g, device=device).float())
    x = x.view(M, K)
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-448, 448)
    return x.to(dtype)


def reference_math(x: torch.Tensor, gs: torch.Tensor, offsets: torch.Tensor, sf_numel: int):
    """quantize_reference's tensor math without its host-side checks (gs stays on the device)."""
    m, k = x.shape
    blocks = x.float().view(m, k // 16, 16)
    mag = blocks.abs()
    amax = torch.where(torch.isnan(mag), torch.full_like(mag, -1.0), mag).amax(dim=-1)
    amax = torch.where(amax < 0, torch.full_like(amax, float("nan")), amax)
    sf_bits = e4m3_satfinite_rne(gs * (amax * torch.tensor(1.0 / 6.0, dtype=torch.float32, device=x.device)))
    sf_val = e4m3_decode(sf_bits)
    out_scale = torch.where(sf_val == 0, torch.zeros_like(sf_val), torch.reciprocal(sf_val * torch.reciprocal(gs)))
    codes = e2m1_satfinite_rne(blocks * out_scale.unsqueeze(-1)) & 0x7
    codes |= torch.signbit(blocks).to(torch.uint8) << 3
    pairs = codes.view(m, k // 2, 2)
    fp4 = pairs[..., 0] | (pairs[..., 1] << 4)
    sf = torch.zeros(sf_numel, dtype=torch.uint8, device=x.device)
    sf[offsets] = sf_bits.view(-1)
    return fp4, sf


def short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text[:200]


def run_row(layout, M: int, K: int, args, bw: float, l2: int, notes: list) -> dict:
    import gdnjit
    from gdnjit.nvfp4 import FourOverSix
    from gdnjit.reference.nvfp4 import quantize_reference
    from gdnjit.sf_layout import padded_sf_shape, sf_offsets

    dev = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    rows, cols = padded_sf_shape(M, K // 16, layout)
    in_bytes = M * K * torch.empty(0, dtype=dtype).element_size()
    nbytes = in_bytes + M * K // 2 + rows * cols
    sets = max(1, math.ceil(args.l2_factor * l2 / nbytes))
    sets = max(1, min(sets, int(args.mem_cap_gb * GB // max(in_bytes, 1))))
    per_token, four6 = MODES[args.mode]
    nbytes += 4 * M if per_token else 0  # the per-token scales written
    xs = [make_input(M, K, dtype, dev, seed=s) for s in range(sets)]
    if per_token:  # the inverse base scale 1 / (448 * 6)
        gss = [torch.tensor([1.0 / 2688.0], device=dev) for _ in xs]
    else:
        gss = [(448.0 * 6.0 / x.float().abs().amax()).reshape(1) for x in xs]
    kw = dict(per_token_activation=per_token, nvfp4_4over6=FourOverSix() if four6 else None)
    rec = dict(layout=layout.name[7:], M=M, K=K, dtype=args.dtype, mode=args.mode, bytes=nbytes, sets=sets,
               l2_resident=sets * nbytes < 2 * l2)

    got = gdnjit.nvfp4_quantize(xs[0], gss[0], layout, **kw)
    ref = quantize_reference(xs[0], gss[0], layout, per_token=per_token, four_over_six=kw["nvfp4_4over6"])
    rec["exact"] = all(torch.equal(g, r) for g, r in zip(got, ref))
    if not rec["exact"]:
        notes.append(f"{rec['layout']} M={M} K={K}: gdnjit bytes differ from the reference")

    us = bc.time_graph(lambda i: gdnjit.nvfp4_quantize(xs[i], gss[i], layout, **kw), n_sets=sets, replays=args.replays)
    rec.update(gdnjit_us=us, gdnjit_gbps=nbytes / us / 1e3, gdnjit_frac=nbytes / (us * 1e-6) / bw)
    us = bc.time_graph(lambda i: gdnjit.nvfp4_quantize(xs[i], gss[i], layout, enable_pdl=False, **kw), n_sets=sets,
                       replays=args.replays)
    rec.update(nopdl_us=us, nopdl_frac=nbytes / (us * 1e-6) / bw)
    # The same number of bytes through a plain SM copy kernel, same rotation: what any kernel of this
    # size can reach (launch, ramp-up and tail included), next to the large-copy floor.
    half = max(1, nbytes // 8)
    srcs = [torch.rand(half, device=dev) for _ in range(sets)]
    dsts = [torch.empty_like(x) for x in srcs]
    rec["copy_us"] = bc.time_graph(lambda i: torch.mul(srcs[i], 1.0, out=dsts[i]), n_sets=sets, replays=args.replays)
    rec["copy_frac"] = 8 * half / (rec["copy_us"] * 1e-6) / bw
    del srcs, dsts
    rec["gdnjit_eager_us"] = bc.time_eager(lambda i: gdnjit.nvfp4_quantize(xs[i], gss[i], layout, **kw),
                                           n_sets=sets, bursts=3 if args.quick else 7)
    if not args.no_ref:
        try:
            rec["ref_us"] = bc.time_events(lambda: quantize_reference(xs[0], gss[0], layout, per_token=per_token,
                                                                      four_over_six=kw["nvfp4_4over6"]),
                                           reps=5 if args.quick else 10)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{rec['layout']} M={M} K={K}: reference failed: {short(e)}")
    if not args.no_compile:
        from torch._dynamo import reset as dynamo_reset
        from torch._dynamo.utils import counters

        offsets = sf_offsets(M, K // 16, layout, device=dev).view(-1)
        try:
            # dynamo caches per code object and, past its recompile limit (8 shapes), silently runs
            # the function eagerly: reset per row so every row times a compiled graph, and check it
            dynamo_reset()
            graphs = counters["stats"]["unique_graphs"]
            compiled = torch.compile(reference_math, dynamic=False)
            out = compiled(xs[0], gss[0], offsets, rows * cols)
            if counters["stats"]["unique_graphs"] == graphs:
                raise RuntimeError("torch.compile produced no graph (ran eagerly)")
            rec["compiled_exact"] = bool(torch.equal(out[0], ref[0]) and torch.equal(out[1].view(rows, cols), ref[1]))
            try:
                rec["compiled_us"] = bc.time_graph(lambda i: compiled(xs[i], gss[i], offsets, rows * cols),
                                                   n_sets=sets, replays=args.replays)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{rec['layout']} M={M} K={K}: compiled reference not graph-capturable "
                             f"({short(e)}); event-timed eager calls instead")
                rec["compiled_us"] = bc.time_events(lambda: compiled(xs[0], gss[0], offsets, rows * cols),
                                                    reps=5 if args.quick else 10)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{rec['layout']} M={M} K={K}: torch.compile failed: {short(e)}")
    for key in ("ref_us", "compiled_us"):
        if key in rec:
            rec[key.replace("_us", "_speedup")] = rec[key] / rec["gdnjit_us"]
    del xs, gss
    torch.cuda.empty_cache()
    return rec


def _f(x, fmt="{:.1f}"):
    return None if x is None else fmt.format(x)


HEADERS = ["layout", "M", "K", "MB", "gdnjit µs", "GB/s", "of copy", "no-PDL µs", "of copy", "same-size copy µs",
           "its frac", "eager µs",
           "ref µs", "x", "compiled µs", "x", "exact", "L2"]


def table_rows(records: list[dict]) -> list[list]:
    return [[r["layout"], r["M"], r["K"], _f(r["bytes"] / 1e6, "{:.2f}"), _f(r.get("gdnjit_us"), "{:.2f}"),
             _f(r.get("gdnjit_gbps"), "{:.0f}"), _f(r.get("gdnjit_frac"), "{:.2f}"), _f(r.get("nopdl_us"), "{:.2f}"),
             _f(r.get("nopdl_frac"), "{:.2f}"), _f(r.get("copy_us"), "{:.2f}"),
             _f(r.get("copy_frac"), "{:.2f}"), _f(r.get("gdnjit_eager_us")),
             _f(r.get("ref_us")), _f(r.get("ref_speedup")), _f(r.get("compiled_us"), "{:.2f}"),
             _f(r.get("compiled_speedup")), "yes" if r.get("exact") else "NO", "L2" if r.get("l2_resident") else ""]
            for r in records]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_nvfp4: needs a CUDA GPU", file=sys.stderr)
        return 2
    from gdnjit.sf_layout import to_sf_layout

    dev = torch.device(args.device)
    if dev.index is None:  # "cuda" means the current device
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    layouts = [to_sf_layout(name) for name in args.layouts]
    bws = bc.copy_bandwidths(dev)
    bw = max(bws.values())
    l2 = bc.l2_bytes(dev)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (memcpy {bws['memcpy'] / 1e12:.2f}, kernel {bws['kernel'] / 1e12:.2f}), "
          f"L2 {l2 / 2**20:.0f} MiB", flush=True)
    records, notes = [], []
    for layout in layouts:
        for K in args.k:
            for M in args.m:
                try:
                    rec = run_row(layout, M, K, args, bw, l2, notes)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    notes.append(f"{layout.name} M={M} K={K}: row failed: {short(e)}")
                    continue
                records.append(rec)
                print(bc.format_table(HEADERS, table_rows([rec])).splitlines()[-1], flush=True)
    print()
    print(bc.format_table(HEADERS, table_rows(records)))
    for n in notes:
        print("note:", n)
    if args.out:
        meta = dict(bc.env_info(dev), copy_bandwidth_tbps=bw / 1e12, copy_bandwidths={k: v / 1e12 for k, v in bws.items()},
                    dtype=args.dtype, global_scale="one-element fp32 device tensor", timing="CUDA graph replay median")
        paths = bc.write_results(args.out, meta, records, HEADERS, table_rows(records),
                                 title="NVFP4 quantization: gdnjit vs torch reference", notes=notes)
        print("wrote", *paths)
    return 0 if all(r.get("exact") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
