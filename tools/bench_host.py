"""Host overhead of one eager decode call (B=1, T=1, warm cache), against a bare driver launch of
the same kernel, measured in the same run (issue: eager <= bare launch + 2 us).

    PYTHONPATH=/tmp/site:$PWD python3 tools/bench_host.py [--n 5000]

Each figure is host wall time per call over a burst of ``n`` back-to-back calls (no sync inside;
the GPU work per call, ~3-5 us, is shorter than the host time, so the queue never throttles it),
median over 7 bursts. Rows: the gdnjit API call (validation, cached dispatch, pack, launch); the
launcher alone (pack + stream lookup + cuLaunchKernel); a bare cuLaunchKernel with a prebuilt
parameter buffer; torch.cuda.current_stream(); the raw stream getter; a small torch op; fla's eager call.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_host: needs a CUDA GPU", file=sys.stderr)
        return 2
    import gdnjit
    from gdnjit import gdn

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

    api()
    torch.cuda.synchronize()
    (launcher, grid, _, _, tail), = [h for h in gdn._fast.values()]
    ptrs = tuple(x.data_ptr() for x in (q, k, v, A_log, a, dt_bias, b, state)) + (0, 0, out.data_ptr(), 0, 0)
    values = ptrs + tail

    def launcher_only():
        launcher(grid, values)

    launcher._pack(launcher.buf, 0, *values)
    raw_stream = torch._C._cuda_getCurrentRawStream(0)
    launch = launcher._launch
    fn = launcher.function

    def bare():
        launch(fn, grid, 1, 1, launcher.block, 1, 1, 0, raw_stream, launcher.params_addr, 0)

    small = torch.zeros(16, device=dev)
    rows = [
        ("gdnjit API call (B=1, T=1)", per_call_us(api, args.n)),
        ("launcher: pack + stream + cuLaunchKernel", per_call_us(launcher_only, args.n)),
        ("bare cuLaunchKernel, prebuilt params", per_call_us(bare, args.n)),
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
    api_us, bare_us = rows[0][1], rows[2][1]
    print(f"API - bare launch = {api_us - bare_us:.2f} us (target <= 2.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
