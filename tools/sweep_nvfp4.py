"""Time every valid NVFP4 tunable choice over an (M, K) grid on this GPU; prints the best per shape.

    PYTHONPATH=$PWD python3 tools/sweep_nvfp4.py [--m 128 1024 4096 16384] [--k 2048 7168] [--pdl]
        [--mode plain|4over6|token|token-4over6] --out DIR

``--mode``: one global scale (plain), FlashInfer's 4over6 search (MAE), per-token scales (the one-CTA-per-row form),
or both (bench_nvfp4.py's modes).

The measurements behind the rules in gdnjit/specs/nvfp4_quantize.yaml (docs/perf.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_common as bc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[128, 1024, 4096, 8192, 16384])
    ap.add_argument("--k", type=int, nargs="+", default=[2048, 4096, 7168, 8192])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--pdl", action="store_true", help="the enable_pdl=True variants, launched with PDL")
    ap.add_argument("--mode", default="plain", choices=["plain", "4over6", "token", "token-4over6"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from gdnjit import dispatch, expr, nvfp4
    from gdnjit.runner import RUNNER, device_info
    from gdnjit.config import get_config
    from gdnjit.spec import get_spec
    from gdnjit.timing import time_graph_us
    from gdnjit.variant import Variant
    from gdnjit.warm import warm

    dev = torch.cuda.current_device()
    info = device_info(dev)
    spec = get_spec("nvfp4_quantize")
    bw = bc.copy_bandwidth(torch.device("cuda", dev))
    l2 = bc.l2_bytes(torch.device("cuda", dev))
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    per_token, four6 = args.mode.startswith("token"), args.mode.endswith("4over6")
    rows = []
    print(f"{info.name}: copy {bw / 1e12:.2f} TB/s")
    for K in args.k:
        for M in args.m:
            n_sets = max(2, min(32, -(-3 * l2 // (M * K * 2))))
            gs = torch.tensor([1.0 / 2688.0 if per_token else 448.0 * 6 / 10.0], device="cuda")
            sets = []
            for _ in range(n_sets):
                a = torch.randn(M, K, device="cuda", dtype=dt) * 3
                *outs, call = nvfp4.prepare(a, gs, enable_pdl=args.pdl, per_token=per_token,
                                             four_over_six=nvfp4.FourOverSix() if four6 else None)
                sets.append((call.arg_values(), a, *outs))  # keep the input and the outputs alive while timing
            pdict = dict(call.params)
            fdict = {"M": M, "num_sms": info.num_sms}
            cands = [t for t in spec.all_tunable_choices() if spec.valid(pdict, t)]
            variants = [Variant.make(spec, pdict, t, info.arch) for t in cands]
            warm(variants, get_config())
            rule, _ = dispatch.select(spec, pdict, fdict)
            nbytes = M * K * 2 + M * K // 2 + M * K // 16 + (4 * M if per_token else 0)
            res = []
            for v in variants:
                launcher = RUNNER.get_launcher(v, dev)
                ctx = dict(v.values)
                ctx.update(fdict)
                grid = int(expr.evaluate(dict(spec.launch)["grid"], ctx))
                launch = launcher.launch_pdl if args.pdl else launcher
                us = time_graph_us(lambda i: launch(grid, sets[i][0]), len(sets), replays=15)
                res.append((us, dict(v.tunables)))
            res.sort(key=lambda r: r[0])
            rule_us = next(us for us, t in res if t == rule)
            floor = nbytes / bw * 1e6
            rows.append(dict(M=M, K=K, best=res[0][1], best_us=res[0][0], rule=rule, rule_us=rule_us, floor_us=floor,
                             all=[(round(u, 2), t) for u, t in res]))
            print(f"M={M:6d} K={K:5d} floor {floor:7.1f} us  best {res[0][0]:7.1f} us ({floor / res[0][0]:.2f}) "
                  f"{res[0][1]}  rule {rule_us:7.1f} us ({floor / rule_us:.2f}) {rule}", flush=True)
            del sets
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sweep_nvfp4.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
