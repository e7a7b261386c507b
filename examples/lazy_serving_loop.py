"""A serving loop over a state-slot pool with gdnjit's lazy state: plain and speculative steps replayed from CUDA
graphs, requests joining and finishing, every output checked against float64 sequential decoding.

What a serving engine does with one linear-attention (GDN) layer, the lazy way (docs/design.md section 11): a slot
keeps its checkpoint state in the pool and the last tokens in a ring (``cache = lazy_cache(...)``), and

    out = gated_delta_rule_lazy_step(q, k, v, A_log, a, dt_bias, b, pool, slots, cache)                    # plain
    out = gated_delta_rule_lazy_step(q, k, v, A_log, a, dt_bias, b, pool, slots, cache, num_accepted=acc)  # drafts

reads each slot's checkpoint once, computes the T new tokens' outputs from it and the ring, appends their rows, and
folds the ring into the checkpoint (the only state write) when it is full. A plain step (T = 1) commits its token at
once; a speculative step's T drafts wait for the next step's ``num_accepted`` (the engine's accepted count of the
slot's previous drafts, 0 for its first). The cursors live with the slots, so rows may be reordered and padded
(slot -1) between steps; the engine's part of the contract, done here:

- a request joins: its prefill writes a fresh checkpoint into the slot, then ``gated_delta_rule_lazy_reset``;
- a request finishes (or its state is read for any reason): ``gated_delta_rule_lazy_fold`` first, with
  ``num_accepted`` of its last speculative step: afterwards ``pool[slot]`` is its current state;
- a slot goes from speculative back to plain steps: the same fold delivers the last accepted count (a plain step
  takes none).

The loop alternates phases of ``--phase`` plain steps (T = 1) and speculative steps (T = ``--draft-tokens``, the
accepted counts random in 1..T), each replayed from one captured CUDA graph over static tensors (``--no-graph``:
eager calls); every few steps a request finishes and another joins on a free slot, and the live requests take random
rows of the ``--batch`` rows (the rest padding). Ground truth: float64 sequential decoding of each request's accepted
token stream from its prefill checkpoint (``gdnjit.reference.lazy.sequential_decode``). Checked: every output (all
T drafts of a speculative step), padding rows' outputs not written (left as they were, or zeros), each finished
request's folded state, every live state at the end, and pool slots no live request owns unchanged. Tolerances
(relative to the largest reference value): outputs 2e-2 (bf16 outputs); states
2e-3 for an fp32 state, 2e-2 for a bf16 one (rounded once per fold). Prints the worst errors and OK (exit status 1
otherwise). Without a CUDA GPU it says so and exits 0; ``--help`` works anywhere.

    python examples/lazy_serving_loop.py
    python examples/lazy_serving_loop.py --state-dtype bf16 --draft-tokens 8 --steps 80
"""

from __future__ import annotations

import argparse
import random
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="rows of every step (the graph's batch; free rows are padding)")
    p.add_argument("--pool-size", type=int, default=24, help="state slots in the pool")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--value-heads", type=int, default=32, help="value heads HV (a multiple of H)")
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256), help="K = V")
    p.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--steps", type=int, default=80, help="steps in all")
    p.add_argument("--phase", type=int, default=20, help="steps of each plain / speculative phase")
    p.add_argument("--draft-tokens", type=int, default=4, help="draft tokens of a speculative step (T)")
    p.add_argument("--churn", type=int, default=3, help="a request finishes and another joins every this many steps")
    p.add_argument("--no-graph", action="store_true", help="call the op eagerly instead of replaying CUDA graphs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.batch < args.pool_size:
        p.error("--batch must be in 1..--pool-size - 1 (a joining request needs a free slot)")
    if not 1 <= args.draft_tokens <= 16:
        p.error("--draft-tokens must be in 1..16")
    if args.value_heads % args.heads:
        p.error("--value-heads must be a multiple of --heads")
    if args.steps < 1 or args.phase < 1 or args.churn < 1:
        p.error("--steps, --phase and --churn must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lazy_serving_loop: no CUDA GPU here; gdnjit's kernels run on CUDA only, so there is nothing to run "
              "(run it on a machine with an NVIDIA GPU)")
        return 0
    import gdnjit

    return serve(args, torch.device("cuda"), gdnjit)


def serve(args, dev, ops) -> int:
    """The loop (module docstring) on ``dev`` with the lazy-state calls of ``ops`` (the gdnjit module)."""
    import torch

    from gdnjit.reference.lazy import sequential_decode

    torch.manual_seed(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rng = random.Random(args.seed)
    bf, f64 = torch.bfloat16, torch.float64
    Bg, T, H, HV, D = args.batch, args.draft_tokens, args.heads, args.value_heads, args.head_dim
    sdt = torch.float32 if args.state_dtype == "fp32" else bf
    ring_dtype = torch.float32 if sdt == torch.float32 else bf  # fp32 rings with an fp32 state, else the state's
    tol_out, tol_state = 2e-2, (2e-3 if sdt == torch.float32 else 2e-2)
    scale = D ** -0.5

    def randn(*shape, s=1.0, dtype=bf):
        return (torch.randn(*shape, generator=gen, device=dev) * s).to(dtype)

    # Model parameters (decays mostly 0.7..0.99 a token, so the ring's older rows still matter) and the pool.
    A_log = -2.0 * torch.rand(HV, generator=gen, device=dev)
    dt_bias = randn(HV, s=0.5, dtype=torch.float32) - 1.0
    pool = randn(args.pool_size, HV, D, D, s=0.1, dtype=sdt)
    initial = pool.clone()
    cache = ops.lazy_cache(args.pool_size, H, HV, D, D, dtype=ring_dtype, device=dev)

    # The ground truth: float64 sequential decoding (gdnjit.reference.lazy.sequential_decode, section 4 token by
    # token) of each request's accepted tokens from its prefill checkpoint.
    def reference(S, q, k, v, a, b, accepted=None):
        """Rows' states ``S [n, HV, V, K]`` (float64) through their tokens ``q, k [n, t, H, K]``, ``v [n, t, HV,
        V]``, ``a, b [n, t, HV]``: the outputs of all t tokens ``[n, t, HV, V]`` and each row's state after its
        first ``accepted[i]`` tokens (all t without ``accepted``)."""
        out, final = sequential_decode(q, k, v, A_log, a, dt_bias, b, S, scale=scale)
        if accepted is None:
            return out, final
        after = torch.empty_like(S)
        for n_acc in set(accepted):
            rows = torch.tensor([i for i, m in enumerate(accepted) if m == n_acc], dtype=torch.long, device=dev)
            _, after[rows] = sequential_decode(q[rows, :n_acc], k[rows, :n_acc], v[rows, :n_acc], A_log,
                                               a[rows, :n_acc], dt_bias, b[rows, :n_acc], S[rows], scale=scale)
        return out, after

    worst = {"output": 0.0, "state": 0.0}
    failures = []

    def check(kind, what, x, ref, tol):
        err = ((x.to(f64) - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        worst[kind] = max(worst[kind], err)
        if not err <= tol:
            failures.append(f"{what}: relative error {err:.3g} > {tol}")

    # ---- requests and slots -------------------------------------------------------------------------------------
    truth = {}     # slot -> the live request's current state (float64 [HV, V, K]): its accepted tokens decoded
    pending = {}   # slot -> accepted count of its last speculative step, not yet given to the kernel (0: none)
    free = list(range(args.pool_size))
    rng.shuffle(free)
    owned_ever, folded_at = set(), {}  # folded_at: a freed slot's pool value right after its final fold
    counts = dict(joined=0, finished=0, plain=0, spec=0, transition_folds=0)

    def slots_tensor(slots):
        return torch.tensor(slots, dtype=torch.int32, device=dev)

    def join():
        slot = free.pop()
        pool[slot] = randn(HV, D, D, s=0.1, dtype=sdt)  # the prefill's checkpoint
        ops.gated_delta_rule_lazy_reset(slots_tensor([slot]), cache)  # the ring restarts from it
        truth[slot] = pool[slot].to(f64)
        pending[slot] = 0
        owned_ever.add(slot)
        folded_at.pop(slot, None)
        counts["joined"] += 1

    def fold(slots, what):
        """Fold the slots' rings (with their pending accepted counts) and check their states."""
        acc = [pending[s] for s in slots]
        ops.gated_delta_rule_lazy_fold(pool, slots_tensor(slots), cache,
                                       num_accepted=slots_tensor(acc) if any(acc) else None)
        for s in slots:
            pending[s] = 0
        check("state", what, pool[slots], torch.stack([truth[s] for s in slots]), tol_state)

    def finish(slot):
        fold([slot], f"finish (slot {slot})")
        folded_at[slot] = pool[slot].clone()
        del truth[slot], pending[slot]
        free.insert(0, slot)  # reused last: freed slots stay idle a while, and are checked unchanged
        counts["finished"] += 1

    for _ in range(max(1, Bg - 2)):  # start with a few padding rows
        join()

    # ---- the two steps: static tensors, each captured once in a CUDA graph ---------------------------------------
    def static(t):
        return dict(q=torch.zeros(Bg, t, H, D, dtype=bf, device=dev), k=torch.zeros(Bg, t, H, D, dtype=bf, device=dev),
                    v=torch.zeros(Bg, t, HV, D, dtype=bf, device=dev), a=torch.zeros(Bg, t, HV, dtype=bf, device=dev),
                    b=torch.zeros(Bg, t, HV, dtype=bf, device=dev), out=torch.zeros(Bg, t, HV, D, dtype=bf, device=dev),
                    idx=torch.full((Bg,), -1, dtype=torch.int32, device=dev),
                    acc=torch.zeros(Bg, dtype=torch.int32, device=dev))

    st = {"plain": static(1), "spec": static(T)}

    def call(mode):
        x = st[mode]
        ops.gated_delta_rule_lazy_step(x["q"], x["k"], x["v"], A_log, x["a"], dt_bias, x["b"], pool, x["idx"], cache,
                                       num_accepted=x["acc"] if mode == "spec" else None, output=x["out"])

    graphs = {}
    for mode in st:
        call(mode)  # compile / load the kernel outside the capture (all padding rows: touches nothing)
        if not args.no_graph:
            graphs[mode] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[mode]):
                call(mode)
    sentinel = 7.0  # padding rows of a given output are left as they were

    def step(n, mode):
        x = st[mode]
        t = x["q"].shape[1]
        live = list(truth)
        rows = rng.sample(range(Bg), len(live))  # requests take random rows, the rest are padding
        slot_of_row = [-1] * Bg
        for r, s in zip(rows, live):
            slot_of_row[r] = s
        for name in ("q", "k", "v", "a", "b"):  # new activations from "the rest of the model"
            x[name].copy_(randn(*x[name].shape))
        x["idx"].copy_(slots_tensor(slot_of_row))
        x["acc"].copy_(slots_tensor([pending[s] if s >= 0 else 0 for s in slot_of_row]))
        x["out"].fill_(sentinel)
        if mode in graphs:
            graphs[mode].replay()
        else:
            call(mode)
        # the engine accepts n of the T drafts (all of a plain step's token): the truth moves on by n tokens, the
        # kernel learns n at the slot's next step (or fold)
        accepted = None if mode == "plain" else [rng.randint(1, t) for _ in live]
        rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
        S = torch.stack([truth[s] for s in live])
        outs, after = reference(S, *(x[name][rows_t] for name in ("q", "k", "v", "a", "b")), accepted=accepted)
        check("output", f"step {n} ({mode}): outputs", x["out"][rows_t], outs, tol_out)
        pad = [r for r in range(Bg) if slot_of_row[r] < 0]
        if pad and not bool(((x["out"][pad] == sentinel) | (x["out"][pad] == 0)).all()):
            failures.append(f"step {n} ({mode}): a padding row's output was written (neither left as it was nor 0)")
        for i, s in enumerate(live):
            truth[s] = after[i]
            if accepted is not None:
                pending[s] = accepted[i]
        counts[mode] += 1

    prev = "plain"
    for n in range(args.steps):
        mode = "spec" if (n // args.phase) % 2 else "plain"
        if mode == "plain" and prev == "spec" and truth:  # back to plain steps: deliver the accepted counts
            fold(sorted(truth), f"step {n}: fold before plain steps")
            counts["transition_folds"] += 1
        if n and n % args.churn == 0:  # one request finishes, another joins (sometimes only one of the two)
            if truth and (len(truth) == Bg or rng.random() < 0.8):
                finish(rng.choice(sorted(truth)))
            if free and len(truth) < Bg and (not truth or rng.random() < 0.8):
                join()
        if truth:
            step(n, mode)
        prev = mode
    if truth:
        fold(sorted(truth), "end: the live requests' states")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

    never = [s for s in range(args.pool_size) if s not in owned_ever]
    if never and not torch.equal(pool[never], initial[never]):
        failures.append("a slot no request ever owned changed")
    idle = [s for s, v in folded_at.items() if s not in truth and not torch.equal(pool[s], v)]
    if idle:
        failures.append(f"finished requests' slots changed after their final fold: {idle}")
    print(f"pool {tuple(pool.shape)} {args.state_dtype}, H={H} HV={HV} K=V={D}, batch {Bg}, "
          f"{'CUDA graphs' if graphs else 'eager calls'}: {counts['plain']} plain steps, {counts['spec']} "
          f"speculative steps (T={T}), {counts['joined']} requests joined, {counts['finished']} finished, "
          f"{counts['transition_folds']} folds back to plain steps")
    print(f"worst relative errors against float64 sequential decoding: outputs {worst['output']:.2e} (tolerance "
          f"{tol_out:g}), states {worst['state']:.2e} (tolerance {tol_state:g})")
    if failures:
        print("FAILED\n  " + "\n  ".join(failures[:20]))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
