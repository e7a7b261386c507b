"""Benchmark gdnjit's causal_conv1d_update against the copy floor measured in the same run.

Usage (GPU machine, repo root as working dir)::

    python3 tools/bench_conv.py --out $OUT
    python3 tools/bench_conv.py --b 1 64 512 --t 1 4 --d 12288

Grid (defaults): B in {1, 32, 128, 512} x T in {1, 2, 4, 8} x D in {8192, 12288} (Qwen3-Next and
Qwen3.5-397B conv channels at TP 1), W = 4, bf16 everywhere, no bias, silu, vLLM's layouts: a
[slots, state_len, D] cache viewed as [slots, D, state_len], a pool of 2B slots indexed by a random
permutation. T = 1 is a decode step (x [B, D]); T > 1 is a speculative verify step (varlen x
[B * T, D], query_start_loc, num_accepted_tokens uniform in 1..T).

Columns: bytes (state columns read (W - 1) and written (W - 1, or W - 2 + T), x read, out written,
weights read once), gdnjit µs per call from CUDA-graph replays (``bench_common.time_graph``, median,
input sets rotated past 3x L2), the achieved bandwidth, and its fraction of the copy bandwidth measured
at the start of the run. Correctness is checked against the float64 reference before timing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, last

import bench_common as bc  # noqa: E402
import gdnjit  # noqa: E402
from gdnjit.reference.conv import conv_reference  # noqa: E402

W = 4


def make_set(B: int, T: int, D: int, device) -> dict:
    cols = W - 1 if T == 1 else W - 2 + T
    state = torch.randn(2 * B, cols, D, device=device, dtype=torch.bfloat16).transpose(1, 2)
    kw = dict(conv_state=state, weight=torch.randn(D, W, device=device, dtype=torch.bfloat16) / W,
              conv_state_indices=torch.randperm(2 * B, device=device)[:B].to(torch.int32), activation="silu")
    if T == 1:
        x = torch.randn(B, D, device=device, dtype=torch.bfloat16)
    else:
        x = torch.randn(B * T, D, device=device, dtype=torch.bfloat16)
        kw.update(query_start_loc=torch.arange(0, B * T + 1, T, device=device, dtype=torch.int32), max_query_len=T,
                  num_accepted_tokens=torch.randint(1, T + 1, (B,), device=device, dtype=torch.int32))
    kw["x"], kw["out"] = x, torch.empty_like(x)
    return kw


def nbytes(B: int, T: int, D: int) -> int:
    cols_w = W - 1 if T == 1 else W - 2 + T
    return 2 * (B * D * (W - 1) + B * D * cols_w + 2 * B * T * D + D * W)


def check(kw: dict) -> None:
    before = kw["conv_state"].clone()
    out = gdnjit.causal_conv1d_update(**kw)
    ref_out, ref_state = conv_reference(kw["x"], before, kw["weight"], None, True, kw["conv_state_indices"],
                                        kw.get("num_accepted_tokens"), kw.get("query_start_loc"),
                                        kw.get("max_query_len", -1))
    torch.testing.assert_close(out.double(), ref_out, rtol=2**-7, atol=1e-5)
    if not torch.equal(kw["conv_state"], ref_state):
        raise AssertionError("conv state differs from the reference")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--b", type=int, nargs="+", default=[1, 32, 128, 512])
    p.add_argument("--t", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--d", type=int, nargs="+", default=[8192, 12288])
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--out", metavar="DIR", help="write results.json and results.md into DIR")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    bw = bc.copy_bandwidth(dev)
    l2 = bc.l2_bytes(dev)
    headers = ["D", "T", "B", "bytes", "us", "GB/s", "of copy"]
    rows, records = [], []
    for D in args.d:
        for T in args.t:
            for B in args.b:
                n = nbytes(B, T, D)
                sets = [make_set(B, T, D, dev) for _ in range(max(2, min(64, math.ceil(3 * l2 / n))))]
                check(sets[0])
                us = bc.time_graph(lambda i: gdnjit.causal_conv1d_update(**sets[i]), len(sets), replays=args.replays)
                gbs = n / (us * 1e-6) / 1e9
                rows.append([D, T, B, n, f"{us:.2f}", f"{gbs:.0f}", f"{gbs * 1e9 / bw:.2f}"])
                records.append(dict(D=D, T=T, B=B, bytes=n, us=us, frac=gbs * 1e9 / bw))
                print(bc.format_table(headers, rows[-1:]).splitlines()[-1], flush=True)
                del sets
                torch.cuda.empty_cache()
    print(bc.format_table(headers, rows))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    if args.out:
        bc.write_results(args.out, dict(bc.env_info(dev), copy_tb_s=bw / 1e12), records, headers, rows,
                         title="causal_conv1d_update (gdnjit) vs the copy floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
