"""gdnjit GDN across state dtypes, layouts and verify mode, against the copy-bandwidth floor.

    PYTHONPATH=$PWD python3 tools/bench_gdn_modes.py [--b 32 64 128 512] [--t 1 2 4 8] [--hv 64 32] --out DIR

Modes: ``fp32`` / ``bf16`` (K-last state updated in place over a pool, T tokens), ``kmajor`` (fp32
K-major direct state), ``verify`` / ``verify_bf16`` (intermediate states cached, pool not updated),
``recovery`` / ``recovery_bf16`` (FlashInfer's fused state recovery: ``accepted_steps`` uniform in 0..T-1, the state
after each request's step the only pool write: the same floor as ``fp32`` / ``bf16``, whose times it compares with).
Floor bytes = state read + state write (unless verify) + intermediate writes + q/k/v/o/a/b, over the
copy bandwidth measured in the same run. CUDA-graph replay medians, rotating input sets so the
working set is >= 3x L2 (tools/bench_common, gdnjit.tune's input builder). The dispatcher's choice
is timed (a tuned table in the cache dir applies). ``--placements N`` times every point on N fresh
allocations, each made behind a spacer allocation of a different size so the buffers land elsewhere, and
reports the median (and the range): at B = 32 one kernel read 7-10% apart depending on where its buffers
landed (docs/perf.md v12).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

import gdnjit
from gdnjit.gdn import NATIVE_CONVENTIONS

sys.path.insert(0, os.path.dirname(__file__))
import bench_common as bc  # noqa: E402

MODES = {
    "fp32": dict(layout="klast", state_dtype="fp32", update=True, inter_dtype="none"),
    "bf16": dict(layout="klast", state_dtype="bf16", update=True, inter_dtype="none"),
    "kmajor": dict(layout="kmajor", state_dtype="fp32", update=True, inter_dtype="none"),
    "klast_direct": dict(layout="klast", state_dtype="fp32", update=True, inter_dtype="none"),
    "verify": dict(layout="klast", state_dtype="fp32", update=False, inter_dtype="fp32"),
    "verify_bf16": dict(layout="klast", state_dtype="bf16", update=False, inter_dtype="bf16"),
    "recovery": dict(layout="klast", state_dtype="fp32", update=True, inter_dtype="none", recovery=True),
    "recovery_bf16": dict(layout="klast", state_dtype="bf16", update=True, inter_dtype="none", recovery=True),
}


def params_for(mode: str, T: int) -> dict:
    m = MODES[mode]
    return dict(layout=m["layout"], K=128, V=128, T=T, in_dtype="bf16", out_dtype="bf16",
                state_dtype=m["state_dtype"], dtb_dtype="fp32", pool=m["layout"] == "klast" and mode != "klast_direct",
                idx_dtype="int32", same_pool=True, inter_dtype=m["inter_dtype"], ssm_idx_dtype="none",
                update=m["update"], l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS)


def floor_bytes(p: dict, B: int, H: int, HV: int) -> int:
    es = 4 if p["state_dtype"] == "fp32" else 2
    state = B * HV * p["V"] * p["K"] * es
    inter = 0 if p["inter_dtype"] == "none" else p["T"] * B * HV * p["V"] * p["K"] * (4 if p["inter_dtype"] == "fp32" else 2)
    io = p["T"] * B * (2 * H * p["K"] + 2 * HV * p["V"] + 2 * HV) * 2
    return state * (2 if p["update"] else 1) + inter + io


def call_op(p: dict, tensors, accepted_steps=None) -> None:
    """One public-API call of mode params ``p`` on an input set built by gdnjit.tune's builder (the gdn op's
    example_call: q, k, v, a, b, A_log, dt_bias, pool, read, write, inter, ssm, out); ``accepted_steps``: the
    recovery modes' per-request steps."""
    q, k, v, a, b, A_log, dt_bias, pool, read, write, inter, ssm, out = tensors
    if p["layout"] == "kmajor":
        gdnjit.gated_delta_rule_decode(q, k, v, pool, A_log, a, dt_bias, b, output=out)
    elif not p["pool"]:
        gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, pool, A_log, a, dt_bias, b, output=out)
    else:
        gdnjit.gated_delta_rule_mtp(q, k, v, pool, read, A_log, a, dt_bias, b, output=out,
                                    intermediate_states_buffer=inter, disable_state_update=not p["update"],
                                    accepted_steps=accepted_steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--b", type=int, nargs="+", default=[1, 32, 64, 128, 512])
    ap.add_argument("--t", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--hv", type=int, nargs="+", default=[64])
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--out", default=None)
    ap.add_argument("--placements", type=int, default=1,
                    help="fresh allocations per point (median reported); default 1")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gdn_modes: needs a CUDA GPU", file=sys.stderr)
        return 2
    from gdnjit.spec import get_spec
    from gdnjit.timing import time_graph_us
    from gdnjit.tune import _input_sets

    dev = torch.device("cuda", torch.cuda.current_device())
    bw = bc.copy_bandwidth(dev)
    l2 = bc.l2_bytes(dev)
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}, copy bandwidth {bw / 1e12:.2f} TB/s")
    spread = args.placements > 1
    print(f"{'mode':12s} {'HV':>3s} {'B':>4s} {'T':>2s} {'floor us':>9s} {'us':>9s} {'frac':>5s}"
          + (f" {'min us':>9s} {'max us':>9s}" if spread else ""))
    for mode in args.modes:
        for HV in args.hv:
            for T in args.t:
                if mode in ("kmajor", "klast_direct") and T > 1:
                    continue
                if mode.startswith(("verify", "recovery")) and T == 1:
                    continue
                for B in args.b:
                    p = params_for(mode, T)
                    acc = None
                    if MODES[mode].get("recovery"):
                        gen = torch.Generator(dev).manual_seed(B * T)
                        acc = torch.randint(0, T, (B,), dtype=torch.int32, device=dev, generator=gen)
                    times = []
                    for placement in range(args.placements):
                        # a spacer of another size each time: the sets land on other memory
                        spacer = torch.empty(placement * (192 << 20), dtype=torch.uint8, device=dev)
                        sets = _input_sets(get_spec("gdn"), p, dict(B=B, H=args.h, HV=HV), dev,
                                           lambda nbytes: max(2, min(64, -(-3 * l2 // max(nbytes, 1)), (20 << 30) // nbytes)))

                        times.append(time_graph_us(lambda i, sets=sets, p=p: call_op(p, sets[i][2], acc), len(sets),
                                                   calls=10, replays=20))
                        del sets, spacer
                        torch.cuda.empty_cache()
                    us = statistics.median(times)
                    fl = floor_bytes(p, B, args.h, HV) / bw * 1e6
                    row = dict(mode=mode, HV=HV, B=B, T=T, floor_us=round(fl, 2), us=round(us, 2), frac=round(fl / us, 3))
                    if spread:
                        row.update(min_us=round(min(times), 2), max_us=round(max(times), 2))
                    rows.append(row)
                    print(f"{mode:12s} {HV:3d} {B:4d} {T:2d} {fl:9.1f} {us:9.1f} {fl / us:5.2f}"
                          + (f" {min(times):9.1f} {max(times):9.1f}" if spread else ""), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "modes.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(dev), copy_bw=bw, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
