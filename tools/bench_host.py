"""Host overhead of one eager decode call (B=1, T=1, warm cache), against a bare driver launch of
the same kernel, measured in the same run (issue: eager <= bare launch + 2 us).

    PYTHONPATH=/tmp/site:$PWD python3 tools/bench_host.py [--n 5000]

Each figure is host wall time per call over a burst of ``n`` back-to-back calls (no sync inside;
the GPU work per call, ~3-5 us, is shorter than the host time, so the queue never throttles it),
median over 7 bursts. Rows: the gdnjit API call (validation, cached dispatch, pack, launch) with the
output passed and allocated; the bound launch alone (pack pointers, stream lookup, launch); two bare
launches of the same kernel with a prebuilt parameter buffer: ``cuLaunchKernel`` through cuda.bindings
(the issue's reference) and ``cuLaunchKernelEx`` through ctypes (what gdnjit uses, the cheapest launch
from Python); torch.cuda.current_stream(); the raw stream getter; a small torch op; fla's eager call.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import torch


def per_call_us(fn, n: int, bursts: int = 7) -> float:
    out = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        out.append((t1 - t0) / n * 1e6)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=800)  # < the launch queue depth: host time, not GPU time
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_host: needs a CUDA GPU", file=sys.stderr)
        return 2
    from cuda.bindings import driver

    import gdnjit
    import gdnjit.config
    from gdnjit import gdn
    from gdnjit import launch as launch_mod
    from gdnjit.launch import launch_config

    dev = "cuda"
    B, T, H, HV, K, V = 1, 1, 16, 64, 128, 128
    bf = dict(device=dev, dtype=torch.bfloat16)
    q, k = torch.randn(B, T, H, K, **bf), torch.randn(B, T, H, K, **bf)
    v = torch.randn(B, T, HV, V, **bf)
    a, b = torch.randn(B, T, HV, **bf), torch.randn(B, T, HV, **bf)
    A_log, dt_bias = torch.rand(HV, device=dev), torch.randn(HV, device=dev)
    state = torch.randn(B, HV, V, K, device=dev)
    out = torch.empty(B, T, HV, V, **bf)

    def api():
        gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, output=out)

    def api_alloc():  # output allocated by the call (one torch.empty more)
        gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b)

    api()
    api_alloc()
    torch.cuda.synchronize()
    (bound, _, _), _ = gdn._fast.values()
    launcher = bound.launcher
    _, call = gdn.prepare("klast", q, k, v, A_log, a, dt_bias, b, state, None, None, None, out, None,
                           None, True, True, True)
    values = call.arg_values()
    ptrs = gdn.NATIVE.pointer_values(call)

    def bound_only():
        bound(ptrs)

    launcher._pack(launcher.buf, 0, *values)
    raw_stream = torch._C._cuda_getCurrentRawStream(0)
    cu_launch, fn = driver.cuLaunchKernel, launcher.function

    def bare_bindings():
        cu_launch(fn, bound.grid, 1, 1, launcher.block, 1, 1, launcher.smem, raw_stream, launcher.params_addr, 0)

    cfg, _attrs = launch_config(bound.grid, launcher.block, launcher.smem, False)
    cfg.hStream = raw_stream
    cfg_addr, ex, fn_addr, params = ctypes.addressof(cfg), launch_mod._launch_kernel_ex(), int(fn), launcher.params_addr

    def bare_ctypes():
        ex(cfg_addr, fn_addr, params, None)

    small = torch.zeros(16, device=dev)
    rows = [
        ("gdnjit API call (B=1, T=1, output passed)", per_call_us(api, args.n)),
        ("gdnjit API call, output allocated", per_call_us(api_alloc, args.n)),
        ("bound launch: pack ptrs + stream + launch", per_call_us(bound_only, args.n)),
        ("bare cuLaunchKernel (cuda.bindings), prebuilt", per_call_us(bare_bindings, args.n)),
        ("bare cuLaunchKernelEx (ctypes), prebuilt", per_call_us(bare_ctypes, args.n)),
        ("torch.cuda.current_stream()", per_call_us(torch.cuda.current_stream, args.n)),
        ("torch._C._cuda_getCurrentRawStream(0)", per_call_us(lambda: torch._C._cuda_getCurrentRawStream(0), args.n)),
        ("small torch op (x.add_(1))", per_call_us(lambda: small.add_(1), args.n)),
    ]
    try:
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd as fla

        def fla_call():
            fla(q, k, v, g=a, beta=b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5, initial_state=state,
                output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                state_v_first=True)

        fla_call()
        rows.append(("fla fused_recurrent eager call", per_call_us(fla_call, max(args.n // 5, 200))))
    except ImportError:
        rows.append(("fla (not installed)", float("nan")))
    print(f"{torch.cuda.get_device_name(0)}; host us per call (median of 7 bursts of {args.n})")
    for name, us in rows:
        print(f"  {name:44s} {us:8.2f}")
    api_us, bare_us, ctypes_us = rows[0][1], rows[3][1], rows[4][1]
    print(f"PDL for this call: {bound.pdl} (GDNJIT_PDL={gdnjit.config.get_config().pdl})")
    print(f"API - bare cuda.bindings launch = {api_us - bare_us:.2f} us (target <= 2.0)")
    print(f"API - bare ctypes launch = {api_us - ctypes_us:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
