"""A serving-style GDN loop over a state-slot pool: decode steps, then a speculative verify with rollback.

What a serving engine does with one linear-attention (GDN) layer, minus the rest of the model:

1. every request owns a slot of a state pool ``[pool_size, HV, V, K]`` (K-last);
2. each decode step runs all live requests at once, padded up to a CUDA-graph batch size: padding rows
   get slot index -1 (nothing read or written, output rows zero). The step is captured in a CUDA graph
   once and replayed with new inputs copied into its static buffers; requests finish and new ones
   take a fresh (zeroed) slot between steps;
3. a speculative verify step runs T draft tokens per request with
   ``gated_delta_rule_mtp(..., intermediate_states_buffer=buf, disable_state_update=True)``: the pool
   is left untouched and ``buf[n, t]`` holds row n's state after token t. Request n accepts k_n of the
   T tokens (1 <= k_n <= T) and rolls back by copying ``buf[n, k_n - 1]`` into its slot;
4. decoding continues from the rolled-back states.

Every step is checked against the float64 torch reference (``gdnjit.reference.gdn.gdn_reference``)
started from a copy of the pool taken before the step; the script prints OK at the end (exit status
1 otherwise). Needs a CUDA GPU; ``--help`` works anywhere.

    python examples/serving_decode_loop.py
    python examples/serving_decode_loop.py --state-dtype bf16 --requests 13 --draft-tokens 6
"""

from __future__ import annotations

import argparse
import sys

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--requests", type=int, default=5, help="live requests (padded up to a CUDA-graph batch size)")
    p.add_argument("--pool-size", type=int, default=24, help="state slots in the pool")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--value-heads", type=int, default=32, help="value heads HV (a multiple of H)")
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256), help="K = V")
    p.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--decode-steps", type=int, default=4, help="decode steps before and after the verify")
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens per request in the verify step (T)")
    p.add_argument("--no-graph", action="store_true", help="call the op eagerly instead of replaying a CUDA graph")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.requests <= min(GRAPH_BATCH_SIZES[-1], args.pool_size):
        p.error(f"--requests must be in 1..min({GRAPH_BATCH_SIZES[-1]}, --pool-size)")
    if not 1 <= args.draft_tokens <= 16:
        p.error("--draft-tokens must be in 1..16")
    if args.value_heads % args.heads:
        p.error("--value-heads must be a multiple of --heads")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("serving_decode_loop: needs a CUDA GPU (gdnjit's kernels run on CUDA only)", file=sys.stderr)
        return 2
    import gdnjit
    from gdnjit.reference.gdn import gdn_reference

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    H, HV, K = args.heads, args.value_heads, args.head_dim
    V = K
    sdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    tol_state = 1e-3 if sdt == torch.float32 else 1e-2  # relative, in norm (bf16: one rounding per write)
    tol_out = 5e-3 if sdt == torch.float32 else 1e-2    # against the reference rounded to bf16
    worst = {"out": 0.0, "state": 0.0, "buffer": 0.0}
    failures = []

    def rel(x, ref):
        x, ref = x.double(), ref.double()
        return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()

    def check(what, x, ref, tol, kind):
        err = rel(x, ref)
        worst[kind] = max(worst[kind], err)
        if not err <= tol:
            failures.append(f"{what}: relative error {err:.3g} > {tol}")

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)

    # ---- model parameters and the pool -------------------------------------------------------------
    A_log = torch.log(torch.rand(HV, generator=gen, device=dev) * 15 + 1)  # fp32 [HV]
    dt_bias = randn(HV, dtype=torch.float32)
    pool = randn(args.pool_size, HV, V, K, dtype=sdt, scale=0.5)
    free = list(range(args.pool_size))
    requests = {}  # request id -> slot
    next_id = 0

    def admit():
        nonlocal next_id
        slot = free.pop(0)
        pool[slot].zero_()  # a new request starts from a zero state
        requests[next_id] = slot
        next_id += 1

    def finish(rid):
        free.append(requests.pop(rid))

    for _ in range(args.requests):
        admit()
    B = next(s for s in GRAPH_BATCH_SIZES if s >= args.requests)  # padded batch (a graph capture size)
    print(f"pool {tuple(pool.shape)} {args.state_dtype}, H={H} HV={HV} K=V={K}, {args.requests} requests "
          f"padded to B={B}, {'CUDA graph' if not args.no_graph else 'eager'} decode")

    def slot_table():
        """int32 [B]: the live requests' slots, then -1 for the padding rows."""
        slots = list(requests.values()) + [-1] * (B - len(requests))
        return torch.tensor(slots, dtype=torch.int32, device=dev)

    # ---- decode step: static buffers, captured once in a CUDA graph -------------------------------
    st = {name: torch.zeros(shape, dtype=torch.bfloat16, device=dev) for name, shape in
          (("q", (B, 1, H, K)), ("k", (B, 1, H, K)), ("v", (B, 1, HV, V)), ("a", (B, 1, HV)), ("b", (B, 1, HV)))}
    st_slots = torch.full((B,), -1, dtype=torch.int32, device=dev)
    st_out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=dev)

    def decode_step():
        gdnjit.gated_delta_rule_decode_pretranspose(
            st["q"], st["k"], st["v"], None, A_log, st["a"], dt_bias, st["b"], output=st_out,
            initial_state=pool, initial_state_indices=st_slots)

    decode_step()  # compile / load the kernel outside the capture (all-padding batch: touches nothing)
    graph = None
    if not args.no_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode_step()

    def run_decode(step: int):
        for t in st.values():  # new activations from "the rest of the model"
            t.copy_(randn(*t.shape))
        st_slots.copy_(slot_table())
        before = pool.clone()
        if graph is not None:
            graph.replay()
        else:
            decode_step()
        ref = gdn_reference(st["q"], st["k"], st["v"], A_log, st["a"], dt_bias, st["b"], before.double(),
                            read_indices=st_slots)
        live = len(requests)
        check(f"decode {step}: output", st_out[:live], ref.output[:live].to(torch.bfloat16), tol_out, "out")
        if not torch.equal(st_out[live:], torch.zeros_like(st_out[live:])):
            failures.append(f"decode {step}: padding rows are not zero")
        check(f"decode {step}: pool", pool, ref.state, tol_state, "state")
        idle = [s for s in range(args.pool_size) if s not in requests.values()]
        if idle and not torch.equal(pool[idle], before[idle]):
            failures.append(f"decode {step}: a slot without a request changed")

    step = 0
    for i in range(args.decode_steps):
        run_decode(step)
        step += 1
        if i == 1 and len(requests) > 1:  # one request finishes, a new one takes a fresh slot
            finish(next(iter(requests)))
            admit()

    # ---- speculative verify: T tokens, pool untouched, per-token states in buf, then rollback ------
    T = args.draft_tokens
    slots = slot_table()
    q, k = randn(B, T, H, K), randn(B, T, H, K)
    v, a, b = randn(B, T, HV, V), randn(B, T, HV), randn(B, T, HV)
    buf = torch.empty(B, T, HV, V, K, dtype=sdt, device=dev)  # allocated once per batch size in a server
    before = pool.clone()
    out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, slots, A_log, a, dt_bias, b,
                                         intermediate_states_buffer=buf, disable_state_update=True)
    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, before.double(), read_indices=slots,
                        intermediate=buf.double(), disable_state_update=True)
    live = len(requests)
    if not torch.equal(pool, before):
        failures.append("verify: disable_state_update=True changed the pool")
    check("verify: output", out[:live], ref.output[:live].to(torch.bfloat16), tol_out, "out")
    check("verify: intermediate states", buf[:live], ref.intermediate[:live], tol_state, "buffer")

    # The sampler accepts k_n of the T tokens of request n (here: random); roll back to the state after
    # token k_n - 1 with one gather + scatter on the device (no sync, graph-capturable).
    accepted = torch.randint(1, T + 1, (live,), generator=gen, device=dev)
    rows = torch.arange(live, device=dev)
    live_slots = slots[:live].long()
    pool[live_slots] = buf[rows, accepted - 1]
    expect = before.double().clone()
    expect[live_slots] = ref.intermediate[rows, accepted - 1]
    check("rollback: pool", pool, expect, tol_state, "state")
    print(f"verify: T={T}, accepted tokens per request {accepted.tolist()}")

    for _ in range(args.decode_steps // 2 or 1):  # decoding continues from the rolled-back states
        run_decode(step)
        step += 1

    torch.cuda.synchronize()
    print(f"{step} decode steps + 1 verify step; worst relative errors: "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    if failures:
        print("FAILED\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
