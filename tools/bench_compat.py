"""gdnjit.compat's vLLM / SGLang entry points against the native calls doing the same work, side by side.

    PYTHONPATH=$PWD python3 tools/bench_compat.py [--b 1 32 64 128 512] [--hv 32 64] [--t 4] --out DIR

Pairs (same shapes, same bytes; CUDA-graph replay medians over rotating input sets, tools/bench_common; each side
measured twice in alternation, at least 256 / B calls a graph):
  vllm_spec     vLLM spec verify (varlen uniform T, 2-D slot map, accepted counts, per-token writes)
                vs native gated_delta_rule_mtp(ssm_state_indices=[B, T], initial_state_indices=the accepted column)
  vllm_decode   vLLM decode (varlen 1-token requests, 1-D slots) vs native decode_pretranspose over the pool (T = 1)
  vllm_packed   vLLM's default decode (fused_recurrent_gated_delta_rule_packed_decode: q / k / v from packed
                [q | k | v] rows) vs the same native decode_pretranspose (T = 1)
  sglang_packed SGLang's default decode (the same packed call, beta rounded to bf16) vs the same native decode
  sglang_verify SGLang target verify (varlen, buffer rows by intermediate_state_indices, disable_state_update)
                vs native gated_delta_rule_mtp(intermediate_states_buffer, disable_state_update=True)
  sglang_tree   the same with a random EAGLE tree (retrieve_parent_token) vs the native chain verify
Ratio = compat / native (target <= 1.05).

--force JSON (e.g. '{"lanes_per_row": 8, "ilp": 2, "tile_v": 64, "stage": false}') runs both calls of every pair
in the variant of those gdn tunables (tests/ops/gdn_cases.forcing: each call's choice with them applied, staging on
unless named; a call no such variant takes fails): candidates for a spec `retile` entry are read by their compat
column against an unforced run's native column (docs/perf.md v35, v36).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

import gdnjit
from gdnjit.compat import sglang, vllm

sys.path.insert(0, os.path.dirname(__file__))
import bench_common as bc  # noqa: E402

H, K, V = 16, 128, 128


def make_set(B, T, HV, sdt, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    rng = random.Random(seed)
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g)
    k = torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g)
    v = torch.randn(B, T, HV, V, device=dev, dtype=bf, generator=g)
    a = torch.randn(B, T, HV, device=dev, dtype=bf, generator=g)
    b = torch.randn(B, T, HV, device=dev, dtype=bf, generator=g)
    A_log = torch.rand(HV, device=dev, generator=g)
    dtb = torch.randn(HV, device=dev, generator=g)
    slots = B * T + 1
    pool = (torch.randn(slots, HV, V, K, device=dev, generator=g) * 0.1).to(sdt)
    perm = torch.tensor(rng.sample(range(1, slots), B * T), dtype=torch.int32, device=dev).view(B, T)
    acc = torch.tensor([rng.randint(1, T) for _ in range(B)], dtype=torch.int32, device=dev)
    read = perm.gather(1, (acc.long() - 1).unsqueeze(1)).squeeze(1).contiguous()
    buf = torch.empty(B, T, HV, V, K, device=dev, dtype=sdt) if T > 1 else None
    rows = torch.arange(B, dtype=torch.int32, device=dev)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=dev)
    parent = torch.tensor([[0] + [rng.randrange(t) for t in range(1, T)] for _ in range(B)], dtype=torch.int32,
                          device=dev)
    out = torch.empty(B, T, HV, V, device=dev, dtype=bf)
    mixed = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], 1) if T == 1 else None  # the conv output's rows
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dtb=dtb, pool=pool, perm=perm, acc=acc, read=read, buf=buf,
                rows=rows, cu=cu, parent=parent, out=out, mixed=mixed, B=B, T=T)


def flat(x, s):
    return x.view(1, s["B"] * s["T"], *x.shape[2:])


def gates2d(x, s):
    return x.view(s["B"] * s["T"], x.shape[-1])


def _native_decode(s):
    return gdnjit.gated_delta_rule_decode_pretranspose(s["q"], s["k"], s["v"], None, s["A_log"], s["a"], s["dtb"],
                                                       s["b"], output=s["out"], initial_state=s["pool"],
                                                       initial_state_indices=s["read"])


def _packed_pair(engine):
    """An engine's packed decode (q / k / v from the packed rows) and the native decode of the same work."""
    return (lambda s: engine.fused_recurrent_gated_delta_rule_packed_decode(
        s["mixed"], gates2d(s["a"], s), gates2d(s["b"], s), s["A_log"], s["dtb"], K ** -0.5, s["pool"], s["out"],
        s["read"], use_qk_l2norm_in_kernel=True), _native_decode)


CALLS = {
    "vllm_spec": (
        lambda s: vllm.fused_sigmoid_gating_delta_rule_update(
            s["A_log"], gates2d(s["a"], s), gates2d(s["b"], s), s["dtb"], flat(s["q"], s), flat(s["k"], s),
            flat(s["v"], s), initial_state=s["pool"], cu_seqlens=s["cu"], ssm_state_indices=s["perm"],
            num_accepted_tokens=s["acc"], use_qk_l2norm_in_kernel=True),
        lambda s: gdnjit.gated_delta_rule_mtp(s["q"], s["k"], s["v"], s["pool"], s["read"], s["A_log"], s["a"],
                                              s["dtb"], s["b"], output=s["out"], ssm_state_indices=s["perm"],
                                              disable_state_update=False)),
    "vllm_decode": (
        lambda s: vllm.fused_sigmoid_gating_delta_rule_update(
            s["A_log"], gates2d(s["a"], s), gates2d(s["b"], s), s["dtb"], flat(s["q"], s), flat(s["k"], s),
            flat(s["v"], s), initial_state=s["pool"], cu_seqlens=s["cu"], ssm_state_indices=s["read"],
            use_qk_l2norm_in_kernel=True),
        _native_decode),
    "vllm_packed": _packed_pair(vllm),
    "sglang_packed": _packed_pair(sglang),
    "sglang_verify": (
        lambda s: sglang.fused_sigmoid_gating_delta_rule_update(
            s["A_log"], gates2d(s["a"], s), s["dtb"], 1.0, 20.0, flat(s["q"], s), flat(s["k"], s), flat(s["v"], s),
            gates2d(s["b"], s), s["pool"], s["read"], use_qk_l2norm_in_kernel=True, cu_seqlens=s["cu"],
            disable_state_update=True, intermediate_states_buffer=s["buf"], intermediate_state_indices=s["rows"]),
        lambda s: gdnjit.gated_delta_rule_mtp(s["q"], s["k"], s["v"], s["pool"], s["read"], s["A_log"], s["a"],
                                              s["dtb"], s["b"], output=s["out"], intermediate_states_buffer=s["buf"],
                                              disable_state_update=True)),
    "sglang_tree": (
        lambda s: sglang.fused_sigmoid_gating_delta_rule_update(
            s["A_log"], gates2d(s["a"], s), s["dtb"], 1.0, 20.0, flat(s["q"], s), flat(s["k"], s), flat(s["v"], s),
            gates2d(s["b"], s), s["pool"], s["read"], use_qk_l2norm_in_kernel=True, cu_seqlens=s["cu"],
            disable_state_update=True, intermediate_states_buffer=s["buf"], intermediate_state_indices=s["rows"],
            retrieve_parent_token=s["parent"]),
        lambda s: gdnjit.gated_delta_rule_mtp(s["q"], s["k"], s["v"], s["pool"], s["read"], s["A_log"], s["a"],
                                              s["dtb"], s["b"], output=s["out"], intermediate_states_buffer=s["buf"],
                                              disable_state_update=True)),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=list(CALLS), choices=list(CALLS))
    ap.add_argument("--b", type=int, nargs="+", default=[1, 32, 64, 128, 512])
    ap.add_argument("--hv", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--t", type=int, nargs="+", default=[4])
    ap.add_argument("--state", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--force", default=None, metavar="JSON",
                    help="gdn tunables forced on both calls of every pair (module docstring)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        force = bc.parse_force(args.force, "gdn") if args.force is not None else None
    except ValueError as e:
        print(f"bench_compat: --force: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_compat: needs a CUDA GPU", file=sys.stderr)
        return 2
    if force is not None:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
        from gdn_cases import forcing

        with forcing(force):
            return run(args, force)
    return run(args, None)


def run(args, force: dict | None) -> int:
    from gdnjit.timing import time_graph_us

    dev = torch.device("cuda", torch.cuda.current_device())
    l2 = bc.l2_bytes(dev)
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}" + (f", forced {json.dumps(force)}" if force else ""))
    print(f"{'mode':14s} {'state':5s} {'HV':>3s} {'B':>4s} {'T':>2s} {'native us':>10s} {'compat us':>10s} {'ratio':>6s}")
    for mode in args.modes:
        for sd in args.state:
            sdt = torch.float32 if sd == "fp32" else torch.bfloat16
            for HV in args.hv:
                for T in ([1] if mode in ("vllm_decode", "vllm_packed", "sglang_packed") else args.t):
                    for B in args.b:
                        es = 4 if sdt == torch.float32 else 2
                        nbytes = B * HV * V * K * es * (T + 1)
                        n_sets = max(2, min(16, -(-3 * l2 // nbytes), (12 << 30) // (nbytes * (T + 1))))
                        sets = [make_set(B, T, HV, sdt, dev, 1000 * i + B) for i in range(n_sets)]
                        compat, native = CALLS[mode]
                        # small batches: more calls per graph (the graph's own launch is then under 1% of a
                        # replay), and native / compat measured twice in alternation (the mean of the two medians)
                        calls = max(10, 256 // B)
                        t_n = t_c = 0.0
                        for _ in range(2):
                            t_n += time_graph_us(lambda i: native(sets[i]), n_sets, calls=calls, replays=20) / 2
                            t_c += time_graph_us(lambda i: compat(sets[i]), n_sets, calls=calls, replays=20) / 2
                        del sets
                        torch.cuda.empty_cache()
                        rows.append(dict(mode=mode, state=sd, HV=HV, B=B, T=T, native_us=round(t_n, 2),
                                         compat_us=round(t_c, 2), ratio=round(t_c / t_n, 3)))
                        print(f"{mode:14s} {sd:5s} {HV:3d} {B:4d} {T:2d} {t_n:10.2f} {t_c:10.2f} {t_c / t_n:6.3f}",
                              flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "compat.json"), "w") as f:
            json.dump(dict(env=bc.env_info(dev), force=force, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
