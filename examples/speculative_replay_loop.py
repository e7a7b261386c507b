"""A speculative-decoding loop over a state-slot pool with ReplaySSM: verify caches inputs, the commit replays.

What a serving engine does with one linear-attention (GDN) layer per speculative step, the FlashInfer 0.7.2 way
(no T intermediate states stored):

1. verify: ``gated_delta_rule_mtp(..., disable_state_update=True, cache_replayssm=True, replayssm_*=caches)`` runs
   the T draft tokens of every request from its slot's checkpoint, writes their outputs and caches each token's
   raw k, v, log decay and beta at the slot; the pool is not written;
2. the engine accepts ``accept_lens[i]`` (1..T) drafts of request i;
3. commit: ``gated_delta_rule_replayssm_commit(checkpoints, caches, slots, accept_lens)`` replays those tokens
   into the checkpoints (the only state write).

Ground truth: plain T = 1 decoding of the accepted token stream (``gated_delta_rule_decode_pretranspose`` over a
second pool; at token t a request that accepted fewer than t + 1 drafts is a padding row) must give the same
outputs and states. For an fp32 state both paths keep the state in fp32 (tolerance: fp32 rounding, 2e-3); for a
bf16 state plain decoding rounds the state to bf16 after every token, the commit once after the accepted prefix
(and verify not at all), so they differ by up to one bf16 rounding per token (tolerance 2e-2). Prints OK at the
end (exit status 1 otherwise). Needs a CUDA GPU; ``--help`` works anywhere.

    python examples/speculative_replay_loop.py
    python examples/speculative_replay_loop.py --state-dtype bf16 --requests 13 --draft-tokens 6
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
    p.add_argument("--steps", type=int, default=4, help="speculative steps")
    p.add_argument("--draft-tokens", type=int, default=4, help="draft tokens per request and step (T)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.requests <= args.pool_size:
        p.error("--requests must be in 1..--pool-size")
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
        print("speculative_replay_loop: needs a CUDA GPU (gdnjit's kernels run on CUDA only)", file=sys.stderr)
        return 2
    import gdnjit

    torch.manual_seed(args.seed)
    dev, bf = "cuda", torch.bfloat16
    N, T, H, HV, D = args.requests, args.draft_tokens, args.heads, args.value_heads, args.head_dim
    sdt = torch.float32 if args.state_dtype == "fp32" else bf
    tol = 2e-3 if sdt == torch.float32 else 2e-2
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    pool = (torch.randn(args.pool_size, HV, D, D, device=dev) * 0.1).to(sdt)
    truth = pool.clone()  # the ground truth: plain decoding of the accepted tokens
    slots = torch.randperm(args.pool_size, device=dev)[:N].to(torch.int32)
    caches = (torch.empty(args.pool_size, HV, T, D, device=dev, dtype=bf),
              torch.empty(args.pool_size, H, T, D, device=dev, dtype=bf),
              torch.empty(args.pool_size, HV, T, device=dev), torch.empty(args.pool_size, HV, T, device=dev))
    worst_out = worst_state = 0.0
    for _ in range(args.steps):
        q = torch.randn(N, T, H, D, device=dev).to(bf)
        k = torch.randn(N, T, H, D, device=dev).to(bf)
        v = torch.randn(N, T, HV, D, device=dev).to(bf)
        a = torch.randn(N, T, HV, device=dev).to(bf)
        b = torch.randn(N, T, HV, device=dev).to(bf)
        out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, slots, A_log, a, dt_bias, b, disable_state_update=True,
                                             cache_replayssm=True, replayssm_rawv=caches[0], replayssm_rawk=caches[1],
                                             replayssm_g=caches[2], replayssm_beta=caches[3])
        accept = torch.randint(1, T + 1, (N,), dtype=torch.int32, device=dev)
        gdnjit.gated_delta_rule_replayssm_commit(pool[None], *(c[None] for c in caches), slots, accept)
        for t in range(T):  # the ground truth, token by token; requests past their accepted prefix are padding rows
            live = torch.where(accept > t, slots, torch.full_like(slots, -1))
            o, _ = gdnjit.gated_delta_rule_decode_pretranspose(
                q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], None, A_log, a[:, t:t + 1], dt_bias, b[:, t:t + 1],
                initial_state=truth, initial_state_indices=live)
            rows = (accept > t).nonzero().flatten()
            if rows.numel():
                ref = o[rows, 0].float()
                worst_out = max(worst_out, ((out[rows, t].float() - ref).abs().max() / ref.abs().max()).item())
        torch.cuda.synchronize()
        used = slots.long()
        ref = truth[used].float()
        worst_state = max(worst_state, ((pool[used].float() - ref).abs().max() / ref.abs().max()).item())
    ok = worst_out < 2e-2 and worst_state < tol
    print(f"{args.steps} speculative steps, {N} requests, T={T}, {args.state_dtype} state: worst output error "
          f"{worst_out:.2e}, worst state error {worst_state:.2e} (tolerance {tol:g})")
    untouched = torch.ones(args.pool_size, dtype=torch.bool, device=dev)
    untouched[slots.long()] = False
    if not torch.equal(pool[untouched], truth[untouched]):
        print("slots no request owns changed", file=sys.stderr)
        ok = False
    if not ok:
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
