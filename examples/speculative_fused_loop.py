"""A speculative-decoding serving loop over a state-slot pool with gdnjit's fused step: one launch per layer per step.

What a serving engine does with one linear-attention (GDN) layer per speculative step, the gdnjit way:

    out = gated_delta_rule_spec_step(q, k, v, A_log, a, dt_bias, b, pool, slots, num_accepted, cache)

replays the drafts the previous step verified and the engine accepted (``num_accepted[i]`` of them, cached at the
slot) into the slot's checkpoint, writes it (the only state write), then verifies this step's T drafts from it and
caches their inputs for the next step. A request's first step passes ``num_accepted = 0``; a request that finishes is
flushed (``gated_delta_rule_spec_flush``: its accepted drafts replayed, nothing new) when its final state is wanted.
The cache (``spec_cache``) belongs to the slots, so the batch may change between steps: here every other step one
request finishes (flushed, its slot freed) and a new one joins on a free slot.

Ground truth: plain T = 1 decoding of the accepted token stream (``gated_delta_rule_decode_pretranspose`` over a
second pool) must give the same outputs for the accepted drafts and, after a flush, the same states. fp32 state:
both keep the state in fp32 (tolerance 2e-3); bf16 state: plain decoding rounds the state after every token, the
fused step once per step, after the replayed tokens (tolerance 2e-2). Prints OK at the end (exit status 1
otherwise). Needs a CUDA GPU; ``--help`` works anywhere.

    python examples/speculative_fused_loop.py
    python examples/speculative_fused_loop.py --state-dtype bf16 --requests 13 --draft-tokens 6
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--requests", type=int, default=8, help="requests in the batch")
    p.add_argument("--pool-size", type=int, default=24, help="state slots in the pool")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--value-heads", type=int, default=32, help="value heads HV (a multiple of H)")
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256), help="K = V")
    p.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--steps", type=int, default=6, help="speculative steps")
    p.add_argument("--draft-tokens", type=int, default=4, help="draft tokens per request and step (T)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.requests < args.pool_size:
        p.error("--requests must be in 1..--pool-size - 1 (a joining request needs a free slot)")
    if not 1 <= args.draft_tokens <= 16:
        p.error("--draft-tokens must be in 1..16")
    if args.value_heads % args.heads:
        p.error("--value-heads must be a multiple of --heads")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("speculative_fused_loop: needs a CUDA GPU (gdnjit's kernels run on CUDA only)", file=sys.stderr)
        return 2
    import gdnjit

    torch.manual_seed(args.seed)
    dev, bf = "cuda", torch.bfloat16
    N, T, H, HV, D = args.requests, args.draft_tokens, args.heads, args.value_heads, args.head_dim
    sdt = torch.float32 if args.state_dtype == "fp32" else bf
    tol = 2e-3 if sdt == torch.float32 else 2e-2
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    pool = (torch.randn(args.pool_size, HV, D, D, device=dev) * 0.1).to(sdt)  # prefilled states
    truth = pool.clone()  # the ground truth: plain decoding of the accepted tokens
    cache = gdnjit.spec_cache(args.pool_size, H, HV, T, D, D, dtype=bf, device=dev)
    slots = torch.randperm(args.pool_size, device=dev)[:N].to(torch.int32)
    accepted = torch.zeros(N, dtype=torch.int32, device=dev)  # first step: nothing to replay
    owned = set(slots.tolist())
    worst_out = worst_state = 0.0

    def state_error(rows):
        used = slots[rows].long()
        ref = truth[used].float()
        return ((pool[used].float() - ref).abs().max() / ref.abs().max()).item()

    for step in range(args.steps):
        if step % 2 == 1:  # request 0 finishes: flush its accepted drafts, check its final state, free its slot
            one = slots[:1]
            gdnjit.gated_delta_rule_spec_flush(pool, one, accepted[:1], cache)
            worst_state = max(worst_state, state_error([0]))
            free = sorted(set(range(args.pool_size)) - set(slots.tolist()))
            new = free[torch.randint(len(free), (1,)).item()]  # a new request joins there (its prefill state)
            pool[new] = truth[new] = (torch.randn(HV, D, D, device=dev) * 0.1).to(sdt)
            owned.add(new)
            slots = torch.cat([slots[1:], torch.tensor([new], dtype=torch.int32, device=dev)])
            accepted = torch.cat([accepted[1:], torch.zeros(1, dtype=torch.int32, device=dev)])
        q = torch.randn(N, T, H, D, device=dev).to(bf)
        k = torch.randn(N, T, H, D, device=dev).to(bf)
        v = torch.randn(N, T, HV, D, device=dev).to(bf)
        a = torch.randn(N, T, HV, device=dev).to(bf)
        b = torch.randn(N, T, HV, device=dev).to(bf)
        out = gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dt_bias, b, pool, slots, accepted, cache)
        accepted = torch.randint(1, T + 1, (N,), dtype=torch.int32, device=dev)  # the engine's acceptance
        for t in range(T):  # the ground truth, token by token; requests past their accepted prefix are padding rows
            live = torch.where(accepted > t, slots, torch.full_like(slots, -1))
            o, _ = gdnjit.gated_delta_rule_decode_pretranspose(
                q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], None, A_log, a[:, t:t + 1], dt_bias, b[:, t:t + 1],
                initial_state=truth, initial_state_indices=live)
            rows = (accepted > t).nonzero().flatten()
            if rows.numel():
                ref = o[rows, 0].float()
                worst_out = max(worst_out, ((out[rows, t].float() - ref).abs().max() / ref.abs().max()).item())
    gdnjit.gated_delta_rule_spec_flush(pool, slots, accepted, cache)  # bring every checkpoint up to date
    torch.cuda.synchronize()
    worst_state = max(worst_state, state_error(list(range(N))))
    ok = worst_out < 2e-2 and worst_state < tol
    print(f"{args.steps} speculative steps, {N} requests (one replaced every other step), T={T}, {args.state_dtype} "
          f"state: worst output error {worst_out:.2e}, worst state error {worst_state:.2e} (tolerance {tol:g})")
    never = [s for s in range(args.pool_size) if s not in owned]
    if not torch.equal(pool[never], truth[never]):
        print("slots no request owned changed", file=sys.stderr)
        ok = False
    if not ok:
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
