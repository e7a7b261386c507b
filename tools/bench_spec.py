"""One speculative-decoding step of one GDN layer, done three ways, plus plain decode, against the copy-bandwidth floor.

    PYTHONPATH=$PWD python3 tools/bench_spec.py [--b ...] [--hv ...] [--t ...] [--state ...] --out DIR

Per (state dtype, HV, B, T): B requests of T draft tokens, H = 16, K = V = 128, q/k/v bf16, a pool of B + 1 state
slots (random distinct slots per request), accepted counts uniform in 1..T (fixed per input set):
  verify_copy  today's path: gated_delta_rule_mtp into an intermediate-states buffer (pool untouched), then the
               engine's copy-back of each request's accepted state to its slot (a gather and an index_copy_)
  replayssm    FlashInfer's ReplaySSM: verify caching raw k / v / g / beta per slot, then replayssm_commit (L = 1)
  rs_verify    that verify alone (the issue's verify target: its floor is one state pass)
  rs_commit    that commit alone, replaying the accepted cached tokens into the slots (two state passes)
  fused        gated_delta_rule_spec_step: replay the previous step's accepted tokens and verify the new ones
  decode       one plain decode step (T = 1) over the same pool, for reference
  copy         a dense copy of the B requests' states (an SM copy kernel, `torch.mul(src, 1, out=dst)`): what moving
               two state passes costs at this size, the floor's achievable part (its frac: a copy's own fraction of
               the large-copy bandwidth; small grids do not reach it either)
Floor = the bytes a step must move over the copy bandwidth measured in the same run (bench_common.copy_bandwidth,
read + write): verify_copy (T + 3) x the B requests' states (read, T written, the copy's read + write), replayssm 3
(verify read, commit read + write), rs_verify 1, rs_commit, fused and decode 2; plus q/k/v/a/b read and the outputs
written (not rs_commit), and the cached tokens: T written (replayssm, rs_verify, fused), the accepted ones read back
(replayssm, rs_commit, fused); copy the two state passes alone. frac = floor / measured;
x T=1 = measured / decode's. Microseconds per step per layer: CUDA-graph replay medians over rotating input sets
(working set >= 3x L2). --dry-run (no GPU needed) builds one small input set on the CPU and prints the planned rows
with their floor bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

import gdnjit

sys.path.insert(0, os.path.dirname(__file__))
import bench_common as bc  # noqa: E402

H, K, V = 16, 128, 128
LABELS = {"verify_copy": "verify+copy", "replayssm": "replayssm", "rs_verify": "rs verify", "rs_commit": "rs commit",
          "fused": "fused", "decode": "decode T=1", "copy": "state copy"}
DRY_RUN_L2 = 50 << 20  # H100's L2, to plan the number of input sets without a GPU


def make_set(B, T, HV, sdt, modes, dev, seed):
    """One input set with the tensors the selected modes use."""
    g = torch.Generator(device=dev).manual_seed(seed)
    rng = random.Random(seed)
    bf = torch.bfloat16
    slots = B + 1
    idx = torch.tensor(rng.sample(range(slots), B), dtype=torch.int32, device=dev)
    acc = torch.tensor([rng.randint(1, T) for _ in range(B)], dtype=torch.int32, device=dev)
    s = dict(q=torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g),
             k=torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g),
             v=torch.randn(B, T, HV, V, device=dev, dtype=bf, generator=g),
             a=torch.randn(B, T, HV, device=dev, dtype=bf, generator=g),
             b=torch.randn(B, T, HV, device=dev, dtype=bf, generator=g),
             A_log=torch.rand(HV, device=dev, generator=g),
             dtb=torch.randn(HV, device=dev, generator=g),
             pool=(torch.randn(slots, HV, V, K, device=dev, generator=g) * 0.1).to(sdt),
             idx=idx, acc=acc, out=torch.empty(B, T, HV, V, device=dev, dtype=bf))
    if "verify_copy" in modes:
        # the copy-back's long indices are per step, not per layer: an engine builds them once, so does the set
        s.update(buf=torch.empty(B, T, HV, V, K, device=dev, dtype=sdt), rows=torch.arange(B, device=dev),
                 idx_long=idx.long(), last=acc.long() - 1)
    if {"replayssm", "rs_verify", "rs_commit"} & set(modes):
        # zeros: the commit alone replays them without a verify having written them first
        s.update(rawv=torch.zeros(slots, HV, T, V, device=dev, dtype=bf),
                 rawk=torch.zeros(slots, H, T, K, device=dev, dtype=bf),
                 g_cache=torch.zeros(slots, HV, T, device=dev), beta_cache=torch.zeros(slots, HV, T, device=dev))
    if "fused" in modes:
        cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=dev)
        for x in cache[:4]:  # the first call already replays acc >= 1 cached tokens: give them defined values
            x.zero_()
        s["cache"] = cache
    if "decode" in modes:
        s.update(q1=torch.randn(B, 1, H, K, device=dev, dtype=bf, generator=g),
                 k1=torch.randn(B, 1, H, K, device=dev, dtype=bf, generator=g),
                 v1=torch.randn(B, 1, HV, V, device=dev, dtype=bf, generator=g),
                 a1=torch.randn(B, 1, HV, device=dev, dtype=bf, generator=g),
                 b1=torch.randn(B, 1, HV, device=dev, dtype=bf, generator=g),
                 out1=torch.empty(B, 1, HV, V, device=dev, dtype=bf))
    if "copy" in modes:
        s.update(copy_src=torch.randn(B, HV, V, K, device=dev, generator=g).to(sdt),
                 copy_dst=torch.empty(B, HV, V, K, device=dev, dtype=sdt))
    return s


def set_bytes(s) -> int:
    tensors = [x for val in s.values() for x in (val if isinstance(val, tuple) else (val,))]
    return sum(x.numel() * x.element_size() for x in tensors)


def n_sets_for(state_bytes: int, nbytes: int, l2: int) -> int:
    """Sets to rotate over: every mode reads at least the states once per call (rs_verify only that), so 3x L2 of
    them, within ~24 GiB."""
    return max(2, min(16, -(-3 * l2 // state_bytes), (24 << 30) // nbytes))


def floor_bytes(mode: str, B: int, T: int, HV: int, es: int) -> float:
    """Bytes one step of ``mode`` must move (module docstring)."""
    state = B * HV * V * K * es
    io = B * (2 * H * K + 2 * HV * V + 2 * HV) * 2  # one token's q, k, v, output, a, b (bf16)
    token = H * K * 2 + HV * V * 2 + 2 * HV * 4  # one cached token: raw k, v (bf16), g, beta (fp32)
    cached = B * (T + (T + 1) / 2) * token  # T written, the accepted ones read back (expected (T + 1) / 2)
    written, read_back = B * T * token, B * (T + 1) / 2 * token
    return {"verify_copy": (T + 3) * state + T * io, "replayssm": 3 * state + T * io + cached,
            "rs_verify": state + T * io + written, "rs_commit": 2 * state + read_back,
            "fused": 2 * state + T * io + cached, "decode": 2 * state + io, "copy": 2 * state}[mode]


def copy_back(s):
    """The engine's roll-forward after verify: each request's state after its last accepted token, from the buffer
    to its slot."""
    s["pool"].index_copy_(0, s["idx_long"], s["buf"][s["rows"], s["last"]])


def verify_copy(s):
    gdnjit.gated_delta_rule_mtp(s["q"], s["k"], s["v"], s["pool"], s["idx"], s["A_log"], s["a"], s["dtb"], s["b"],
                                output=s["out"], intermediate_states_buffer=s["buf"], disable_state_update=True)
    copy_back(s)


def rs_verify(s):
    gdnjit.gated_delta_rule_mtp(s["q"], s["k"], s["v"], s["pool"], s["idx"], s["A_log"], s["a"], s["dtb"], s["b"],
                                output=s["out"], disable_state_update=True, cache_replayssm=True,
                                replayssm_rawv=s["rawv"], replayssm_rawk=s["rawk"], replayssm_g=s["g_cache"],
                                replayssm_beta=s["beta_cache"])


def rs_commit(s):
    gdnjit.gated_delta_rule_replayssm_commit(s["pool"].unsqueeze(0), s["rawv"].unsqueeze(0), s["rawk"].unsqueeze(0),
                                             s["g_cache"].unsqueeze(0), s["beta_cache"].unsqueeze(0), s["idx"],
                                             s["acc"])


def replayssm(s):
    rs_verify(s)
    rs_commit(s)


def fused(s):
    # flips the slot's cache half in ctl every call, as in serving; acc (1..T) replays from the other half
    gdnjit.gated_delta_rule_spec_step(s["q"], s["k"], s["v"], s["A_log"], s["a"], s["dtb"], s["b"], s["pool"],
                                      s["idx"], s["acc"], s["cache"], output=s["out"])


def decode(s):
    gdnjit.gated_delta_rule_decode_pretranspose(s["q1"], s["k1"], s["v1"], None, s["A_log"], s["a1"], s["dtb"],
                                                s["b1"], output=s["out1"], initial_state=s["pool"],
                                                initial_state_indices=s["idx"])


def copy(s):
    # an SM kernel: captured into a graph, copy_ becomes a copy-engine memcpy node, slower (bench_common)
    torch.mul(s["copy_src"], 1, out=s["copy_dst"])


CALLS = {"verify_copy": verify_copy, "replayssm": replayssm, "rs_verify": rs_verify, "rs_commit": rs_commit,
         "fused": fused, "decode": decode, "copy": copy}


def shapes(args):
    for sd in args.state:
        for HV in args.hv:
            for T in args.t:
                for B in args.b:
                    yield sd, HV, B, T


def dtype_of(sd):
    return torch.float32 if sd == "fp32" else torch.bfloat16


def dry_run(args) -> int:
    """Build one small set on the CPU (the shapes the calls get), run the copy-back on it, print the plan."""
    sd, HV, B, T = args.state[0], min(args.hv), min(args.b), max(args.t)
    s = make_set(B, T, HV, dtype_of(sd), args.modes, torch.device("cpu"), seed=B)
    print(f"input set {sd} HV={HV} B={B} T={T}: {set_bytes(s) / 2**20:.1f} MiB")
    for name, val in s.items():
        for i, x in enumerate(val if isinstance(val, tuple) else (val,)):
            label = f"{name}.{type(val)._fields[i]}" if isinstance(val, tuple) else name
            print(f"  {label:12s} {str(tuple(x.shape)):24s} {str(x.dtype)[6:]}")
    if "verify_copy" in args.modes:
        copy_back(s)
        print("  copy_back ran on the CPU")
    es = s["pool"].element_size()
    print(f"  n_sets with a {DRY_RUN_L2 >> 20} MiB L2: {n_sets_for(B * HV * V * K * es, set_bytes(s), DRY_RUN_L2)}")
    print(f"{'state':5s} {'HV':>3s} {'B':>4s} {'T':>2s} {'mode':11s} {'floor MB':>9s}")
    for sd, HV, B, T in shapes(args):
        es = dtype_of(sd).itemsize
        for mode in args.modes:
            print(f"{sd:5s} {HV:3d} {B:4d} {T:2d} {LABELS[mode]:11s} {floor_bytes(mode, B, T, HV, es) / 1e6:9.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=list(CALLS), choices=list(CALLS))
    ap.add_argument("--b", type=int, nargs="+", default=[1, 32, 64, 128, 512])
    ap.add_argument("--hv", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--t", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--state", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--quick", action="store_true", help="B 64 128, T 4, HV 64")
    ap.add_argument("--dry-run", action="store_true",
                    help="no timing, no GPU: build one small input set on the CPU, print the planned rows and floors")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.b, args.t, args.hv = [64, 128], [4], [64]
    args.modes = [m for m in CALLS if m in args.modes]  # table order, each mode once
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("bench_spec: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    from gdnjit.timing import time_graph_us

    dev = torch.device("cuda", torch.cuda.current_device())
    bw = bc.copy_bandwidth(dev)
    l2 = bc.l2_bytes(dev)
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}, copy bandwidth {bw / 1e12:.2f} TB/s")
    print(f"{'state':5s} {'HV':>3s} {'B':>4s} {'T':>2s} {'mode':11s} {'floor us':>9s} {'us':>9s} {'frac':>5s} "
          f"{'x T=1':>6s}")
    for sd, HV, B, T in shapes(args):
        sdt = dtype_of(sd)
        es = sdt.itemsize
        first = make_set(B, T, HV, sdt, args.modes, dev, seed=B)
        n_sets = n_sets_for(B * HV * V * K * es, set_bytes(first), l2)
        sets = [first] + [make_set(B, T, HV, sdt, args.modes, dev, seed=1000 * i + B) for i in range(1, n_sets)]
        times = {mode: time_graph_us(lambda i: CALLS[mode](sets[i]), n_sets, calls=10, replays=20)
                 for mode in args.modes}
        del first, sets
        torch.cuda.empty_cache()
        for mode, us in times.items():
            fl = floor_bytes(mode, B, T, HV, es) / bw * 1e6
            x1 = us / times["decode"] if "decode" in times else None
            rows.append(dict(mode=mode, state=sd, HV=HV, B=B, T=T, n_sets=n_sets, us=round(us, 2),
                             floor_us=round(fl, 2), frac=round(fl / us, 3), x_t1=None if x1 is None else round(x1, 2)))
            print(f"{sd:5s} {HV:3d} {B:4d} {T:2d} {LABELS[mode]:11s} {fl:9.1f} {us:9.1f} {fl / us:5.2f} "
                  + ("     -" if x1 is None else f"{x1:6.2f}"), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "spec.json"), "w") as f:
            json.dump(dict(env=bc.env_info(dev), copy_bw=bw, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
