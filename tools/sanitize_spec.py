"""One case of every speculative-decoding kernel (issue 26), for compute-sanitizer:

    compute-sanitizer --tool memcheck  python3 tools/sanitize_spec.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_spec.py

The fused step (two steps: the second replays what the first cached; padding rows, a pool with gaps) and its flush,
in both kernel forms (T = 3 runs the recurrent form at this batch, T = 8 the tc form), and FlashInfer's ReplaySSM
verify cache and commit (with track at T = 3, without at T = 8: the tc form), for fp32 and bf16 state. Small shapes keep the sanitizer
fast; each result is also checked against the float64 reference (exit status 1 on a mismatch). --tile-v 128: the bf16
state's tc calls (T = 8) with 128-row tiles forced (two 64-row blocks per warp; the rules' choice at large batches).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

import gdnjit
from gdnjit.reference.replay import replay_commit_reference
from gdnjit.reference.spec_step import spec_step_reference

DEV = "cuda"
bf = torch.bfloat16
H, HV, K, V, B, S = 2, 4, 128, 128, 5, 9
FUSED_T = (3, 8)  # the recurrent form's and the tc form's (gdn.yaml's rules at B * HV = 20)


def rel(x, ref) -> float:
    return (x.double().cpu() - ref.double().cpu()).abs().max().item() / max(ref.double().abs().max().item(), 1e-6)


def tokens(g, T):
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    return r(B, T, H, K).to(bf), r(B, T, H, K).to(bf), r(B, T, HV, V).to(bf), r(B, T, HV).to(bf), r(B, T, HV).to(bf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tile-v", type=int, choices=[64, 128], default=None,
                    help="force the tc form's tile rows on the T = 8 calls (128: bf16 state only)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ops"))
    from gdn_cases import forcing

    def form(T):  # the tc calls' context: the forced tile, or the rules
        if args.tile_v is None or T != FUSED_T[1]:
            return contextlib.nullcontext()
        return forcing({"form": "tc", "tile_v": args.tile_v})

    bad = 0
    for sdt in ((torch.bfloat16,) if args.tile_v == 128 else (torch.float32, torch.bfloat16)):
        tol = 2e-3 if sdt == torch.float32 else 2e-2
        g = torch.Generator(device=DEV).manual_seed(1)
        A_log, dtb = torch.rand(HV, device=DEV, generator=g), torch.randn(HV, device=DEV, generator=g)
        pool = (torch.randn(S, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
        idx = torch.tensor([6, -1, 2, 8, 4], dtype=torch.int32, device=DEV)
        for T in FUSED_T:
            cache = gdnjit.spec_cache(S, H, HV, T, K, V, dtype=bf, device=DEV)
            for step, acc in enumerate(([0] * B, [2, 1, 3, 0, 1])):
                acc = torch.tensor(acc, dtype=torch.int32, device=DEV)
                q, k, v, a, b = tokens(g, T)
                ref = spec_step_reference(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache)
                with form(T):
                    out = gdnjit.gated_delta_rule_spec_step(q, k, v, A_log, a, dtb, b, pool, idx, acc, cache)
                    torch.cuda.synchronize()
                eo, es = rel(out.float(), ref.output), rel(pool.float(), ref.state.float())
                print(f"spec_step {sdt} T={T} step {step}: output rel {eo:.2e}, state rel {es:.2e}")
                bad += eo > 2e-2 or es > tol
            acc = torch.tensor([3, 2, 1, 1, 2], dtype=torch.int32, device=DEV)
            ref = spec_step_reference(None, None, None, None, None, None, None, pool, idx, acc, cache, flush=True)
            with form(T):
                gdnjit.gated_delta_rule_spec_flush(pool, idx, acc, cache)
                torch.cuda.synchronize()
            e = rel(pool.float(), ref.state.float())
            print(f"spec_flush {sdt} T={T}: rel {e:.2e}")
            bad += e > tol
        # FlashInfer's ReplaySSM: verify with the cache, then the commit (one layer): with track at T = 3 (the recurrent
        # form), without at T = 8 (the tc form: the tokens' and the state tile's copies in two cp.async groups)
        for T, track in ((FUSED_T[0], True), (FUSED_T[1], False)):
            rawv, rawk = torch.zeros(S, HV, T, V, dtype=bf, device=DEV), torch.zeros(S, H, T, K, dtype=bf, device=DEV)
            gc, bc = torch.zeros(S, HV, T, device=DEV), torch.zeros(S, HV, T, device=DEV)
            q, k, v, a, b = tokens(g, T)
            with form(T):
                gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dtb, b, disable_state_update=True,
                                            cache_replayssm=True, replayssm_rawv=rawv, replayssm_rawk=rawk,
                                            replayssm_g=gc, replayssm_beta=bc)
            kw = {}
            if track:
                kw = dict(track_state_indices=torch.tensor([0, -1, 1, 3, 5], dtype=torch.int32, device=DEV),
                          track_steps=torch.tensor([1, 0, 0, 0, 1], dtype=torch.int32, device=DEV))
            acc = torch.tensor([3, 2, 1, T, 2], dtype=torch.int32, device=DEV)
            ck = pool.unsqueeze(0)
            ref = replay_commit_reference(ck, rawv[None], rawk[None], gc[None], bc[None], idx, acc, **kw)
            with form(T):
                gdnjit.gated_delta_rule_replayssm_commit(ck, rawv[None], rawk[None], gc[None], bc[None], idx, acc,
                                                         **kw)
                torch.cuda.synchronize()
            e = rel(ck.float(), ref.float())
            print(f"replayssm verify + commit {sdt} T={T}{' with track' if track else ''}: rel {e:.2e}")
            bad += e > tol
    print("OK" if not bad else f"{bad} MISMATCHES")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
