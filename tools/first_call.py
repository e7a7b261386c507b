"""The first call in a fresh process with a warm cache: gdnjit's time beyond torch's own first CUDA op.

    python tools/first_call.py [--repeat 5] [--out FILE.json] [--tree DIR]

Each sample is a fresh Python process (a subprocess running this file with --child). The child
imports torch, runs one CUDA op and synchronises (torch's own start-up, not counted), builds the
inputs with torch, then times `import gdnjit` + the first call of each op, synchronised, and a second
call for comparison. A first child, not counted, fills the disk cache (the cache dir is a fresh
temp dir unless GDNJIT_CACHE_DIR is set), so the counted children measure spec loading, dispatch,
the disk-cache lookup, the module load and the launch: what a serving process pays per op after
`gdnjit warm`. Reports the median of --repeat children per op. ``--tree DIR`` imports gdnjit from another
checkout (e.g. an older commit, for a before/after comparison in one run; an op it lacks is skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child() -> dict:
    t0 = time.perf_counter()
    import torch

    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    t_torch = time.perf_counter() - t0
    dev, bf = "cuda", torch.bfloat16
    B, H, HV, K, V = 32, 16, 32, 128, 128
    q = torch.randn(B, 1, H, K, device=dev, dtype=bf)
    k = torch.randn(B, 1, H, K, device=dev, dtype=bf)
    v = torch.randn(B, 1, HV, V, device=dev, dtype=bf)
    a = torch.randn(B, 1, HV, device=dev, dtype=bf)
    b = torch.randn(B, 1, HV, device=dev, dtype=bf)
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.rand(HV, device=dev)
    pool = torch.randn(2 * B, HV, V, K, device=dev)
    slots = torch.arange(B, device=dev, dtype=torch.int32) * 2
    x = torch.randn(64, 4096, device=dev, dtype=bf)
    gs = torch.tensor([448.0 * 6.0], device=dev) / x.abs().max().float()
    xc = torch.randn(B, 12288, device=dev, dtype=bf)
    conv_state = torch.randn(2 * B, 3, 12288, device=dev, dtype=bf).transpose(1, 2)
    conv_w = torch.randn(12288, 4, device=dev, dtype=bf)
    torch.cuda.synchronize()
    out = {"torch_first_cuda_op_s": t_torch}

    def gdn():
        gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b, initial_state=pool,
                                                     initial_state_indices=slots)

    def nvfp4():
        gdnjit.nvfp4_quantize(x, gs, gdnjit.SfLayout.layout_128x4)

    def conv():
        gdnjit.causal_conv1d_update(xc, conv_state, conv_w, None, "silu", conv_state_indices=slots)

    profiler = None
    if os.environ.get("GDNJIT_FIRST_CALL_PROFILE"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    import gdnjit

    out["import_gdnjit_s"] = time.perf_counter() - t0
    for name, fn in (("gdn", gdn), ("nvfp4", nvfp4), ("conv", conv)):
        if name == "conv" and not hasattr(gdnjit, "causal_conv1d_update"):
            continue
        for which in ("first", "second"):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out[f"{name}_{which}_s"] = time.perf_counter() - t0
        if profiler is not None and name == "gdn":
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(25)
            print(text.getvalue(), file=sys.stderr)
            profiler = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", help="write the samples and medians as JSON here")
    ap.add_argument("--profile", action="store_true",
                    help="also run one more child under cProfile (import + first GDN call) and print its top 45 by cumulative and top 25 by own time")
    ap.add_argument("--tree", help="import gdnjit from this checkout instead of this file's")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child()))
        return 0
    env = dict(os.environ)
    env.setdefault("GDNJIT_CACHE_DIR", tempfile.mkdtemp(prefix="gdnjit-first-call-"))
    tree = os.path.abspath(args.tree) if args.tree else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))

    def run() -> dict:
        res = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])

    warmup = run()  # compiles into the cache (not counted)
    samples = [run() for _ in range(args.repeat)]
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    for k, val in med.items():
        print(f"{k:24s} {val * 1e3:9.1f} ms (median of {args.repeat} fresh processes)")
    first = med["import_gdnjit_s"] + med["gdn_first_s"]
    conv = f", first conv call after them: {med['conv_first_s'] * 1e3:.1f} ms" if "conv_first_s" in med else ""
    print(f"gdnjit ({tree}): first GDN call, import included: {first * 1e3:.1f} ms; first NVFP4 call after it: "
          f"{med['nvfp4_first_s'] * 1e3:.1f} ms{conv} (cache {env['GDNJIT_CACHE_DIR']})")
    if args.profile:
        res = subprocess.run([sys.executable, __file__, "--child"], env=dict(env, GDNJIT_FIRST_CALL_PROFILE="1"),
                             capture_output=True, text=True, check=True)
        print(res.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"warmup": warmup, "samples": samples, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
