"""Launch one GDN variant with chosen tunables a few times, for a profiler (ncu, nsys).

    ncu -k gdn_step --launch-skip 2 --launch-count 1 --section SpeedOfLight ... \
        python3 tools/profile_gdn.py --b 128 --t 8 --tunables '{"lanes_per_row": 4, ...}'

Inputs come from ``gdnjit.tune``'s builder (one set, random state); the tunables are validated
against the spec (an invalid set is an error, not a silent fallback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def main() -> int:
    import torch

    from gdnjit import expr
    from gdnjit.runner import RUNNER, device_info
    from gdnjit.spec import get_spec
    from gdnjit.tune import _input_sets
    from gdnjit.variant import Variant
    from bench_gdn_modes import MODES, params_for

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="fp32", choices=list(MODES))
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--t", type=int, default=8)
    ap.add_argument("--hv", type=int, default=64)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--tunables", required=True, help="JSON object with every tunable of the gdn spec")
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args()

    spec = get_spec("gdn")
    params = params_for(args.mode, args.t)
    tunables = json.loads(args.tunables)
    variant = Variant.make(spec, params, tunables, device_info(0).arch)
    launcher = RUNNER.get_launcher(variant, 0)
    ctx = dict(variant.values, B=args.b, H=args.h, HV=args.hv)
    grid = int(expr.evaluate(dict(spec.launch)["grid"], ctx))
    (values, _, _tensors), = _input_sets(spec, params, dict(B=args.b, H=args.h, HV=args.hv), torch.device("cuda"),
                                         lambda _: 1)
    for _ in range(args.launches):
        launcher(grid, values)
    torch.cuda.synchronize()
    print(f"{variant.describe()} grid={grid}: {args.launches} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
