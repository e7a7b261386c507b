"""One case of every lazy-state kernel (issue 56), for compute-sanitizer:

    compute-sanitizer --tool memcheck  python3 tools/sanitize_lazy.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_lazy.py

gdnjit's own cursor: plain steps (T = 1; an fp32 state's the eager form) and speculative steps (T = 3, random
accepted counts; the tile form) at this small batch, over a pool with gaps and a padding row, enough steps that every slot folds in a step, then a fold
(rows form) and a reset; plain steps in the rows form (forced: its prep and state launches) over enough rows for the
prep's 4 warps an item, then enough that the prep launch takes a warp an item, and those as the rules give them;
plain steps with fp32 rings (fp32 and bf16 states) in the rows form, every slot folding in a step (tc_fold);
eager steps over rings that lazy plain and speculative steps filled (their fold, the cursor's commit), fp32 and bf16;
the tile form of a 16-bit state and ring a 64-column chunk at a time (the rules stage the small batches' tiles whole),
K 128: speculative steps at T = 4 and 8, every slot folding, and a fold; an fp32 state and rings' speculative steps at
T = 2 and 3 in the rows form (the rules' from B * HV 2048: forced), every slot folding, a fold, and FlashInfer's
verify+flush call at T = 2 in it (rows_speculative); an fp32 state and rings' speculative steps at T = 4 and 8 in the
tile form of 128 rows (the rules' at large batches: the staged tile's dots on CUDA cores, 4 warps), every slot
folding, and a fold (tile_speculative);
FlashInfer's cursor: the verify+flush call (some rows fold) and the
verify-only call, at T = 4 and T = 1 (both the tile form at this batch), the flush also a chunk at a time (T = 4,
8). bf16 and fp32 states, small shapes (the sanitizer is slow). Correctness is the GPU tests' job (tests/ops/test_lazy_gpu.py); this only runs the kernels. Exit status 0
when every call returned.
"""

from __future__ import annotations

import os
import sys

import torch

import gdnjit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
from test_lazy_gpu import forcing  # noqa: E402  (the GPU tests' dispatcher override)

# the tile form a 64-column chunk at a time
CHUNKED = dict(form="tile", lanes_per_row=8, rows_per_lane=1, tile_v=128, staged=False)
# the rows form of a bf16 state (the rules give it folds, and plain steps with fp32 rings)
ROWS = dict(form="rows", lanes_per_row=8, rows_per_lane=4, tile_v=16)
# the rows form of an fp32 state (the rules' at larger batches); with fp32 rings (either state) its folds in a step
# on tensor cores (tc_fold)
ROWS_F32 = dict(form="rows", lanes_per_row=8, rows_per_lane=2, tile_v=16)
# the lazy tile form (the rules' small plain batches of a 16-bit state), and the eager form
LAZY_TILE = dict(form="tile", lanes_per_row=8, rows_per_lane=1, tile_v=32)
EAGER = dict(form="eager", window=0, lanes_per_row=8, rows_per_lane=2, tile_v=16)

DEV = "cuda"
H, HV, K, V, B, S = 2, 4, 64, 64, 5, 9


def main() -> int:
    g = torch.Generator(device=DEV).manual_seed(3)
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    idx = torch.tensor([6, -1, 2, 8, 4], dtype=torch.int32, device=DEV)
    A_log, dtb = torch.rand(HV, device=DEV, generator=g), torch.randn(HV, device=DEV, generator=g)
    for sdt in (torch.bfloat16, torch.float32):
        pool = (r(S, HV, V, K) * 0.1).to(sdt)
        cache = gdnjit.lazy_cache(S, H, HV, K, V, dtype=sdt, device=DEV)
        for T, spec, steps in ((1, False, 18), (3, True, 8)):
            acc = torch.zeros(B, dtype=torch.int32, device=DEV) if spec else None
            for _ in range(steps):
                x = [r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), r(B, T, HV), r(B, T, HV)]
                q, k, v, a, b = (t.to(torch.bfloat16) for t in x)
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc)
                if spec:
                    acc = torch.randint(0, T + 1, (B,), device=DEV, generator=g, dtype=torch.int32)
            gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache, num_accepted=acc)
            gdnjit.gated_delta_rule_lazy_reset(idx, cache)
        torch.cuda.synchronize()
        print(f"lazy step / fold / reset, {sdt}: ran")
    # eager steps over rings filled by lazy plain steps, then by speculative ones (pending rows): their fold, the commit
    for sdt in (torch.float32, torch.bfloat16):
        pool = (r(S, HV, V, K) * 0.1).to(sdt)
        cache = gdnjit.lazy_cache(S, H, HV, K, V, dtype=sdt, device=DEV)
        for T, spec, force in ((1, False, LAZY_TILE), (1, False, EAGER), (3, True, None), (1, False, EAGER),
                               (1, False, EAGER)):
            x = [r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), r(B, T, HV), r(B, T, HV)]
            q, k, v, a, b = (t.to(torch.bfloat16) for t in x)
            acc = torch.randint(0, T + 1, (B,), device=DEV, generator=g, dtype=torch.int32) if spec else None
            with forcing(force):
                for _ in range(3):
                    gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc)
        torch.cuda.synchronize()
        print(f"lazy and eager plain steps, {sdt}: ran")
    # plain steps with fp32 rings in the rows form (forced: the rules' at larger batches), every slot folding in a step
    for sdt, rows in ((torch.float32, ROWS_F32), (torch.bfloat16, ROWS)):
        pool = (r(S, HV, V, K) * 0.1).to(sdt)
        cache = gdnjit.lazy_cache(S, H, HV, K, V, dtype=torch.float32, device=DEV)
        with forcing(rows):
            for _ in range(17):
                x = [r(B, 1, H, K), r(B, 1, H, K), r(B, 1, HV, V), r(B, 1, HV), r(B, 1, HV)]
                q, k, v, a, b = (t.to(torch.bfloat16) for t in x)
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache)
        torch.cuda.synchronize()
        print(f"lazy plain steps, rows form, {sdt} state, fp32 rings, every slot folding in a step: ran")
    # plain steps in the rows form (forced: the rules give a bf16 state and ring's plain steps the tile form): 2 plain
    # steps and a fold over enough rows for the prep launch's 4 warps an item (below 8 items an SM), then over enough
    # rows of 16 key heads, 2 value heads each, for its warp an item
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    B3 = 4 * sms // HV + 1
    pool = (r(B3, HV, V, K) * 0.1).bfloat16()
    cache = gdnjit.lazy_cache(B3, H, HV, K, V, dtype=torch.bfloat16, device=DEV)
    idx3 = torch.arange(B3, dtype=torch.int32, device=DEV)
    with forcing(ROWS):
        for _ in range(2):
            q, k = r(B3, 1, H, K).bfloat16(), r(B3, 1, H, K).bfloat16()
            v, a, b = r(B3, 1, HV, V).bfloat16(), r(B3, 1, HV).bfloat16(), r(B3, 1, HV).bfloat16()
            gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx3, cache)
        gdnjit.gated_delta_rule_lazy_fold(pool, idx3, cache)
    torch.cuda.synchronize()
    print(f"lazy plain steps and a fold, rows form, {B3} rows x {H} key heads: ran")
    H2, B2 = 16, 8 * sms // 16 + 1
    pool = (r(B2, 2 * H2, V, K) * 0.1).bfloat16()
    cache = gdnjit.lazy_cache(B2, H2, 2 * H2, K, V, dtype=torch.bfloat16, device=DEV)
    idx2 = torch.arange(B2, dtype=torch.int32, device=DEV)
    with forcing(ROWS):
        for _ in range(2):
            q, k = r(B2, 1, H2, K).bfloat16(), r(B2, 1, H2, K).bfloat16()
            v, a, b = r(B2, 1, 2 * H2, V).bfloat16(), r(B2, 1, 2 * H2).bfloat16(), r(B2, 1, 2 * H2).bfloat16()
            gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log.repeat(8), a, dtb.repeat(8), b, pool, idx2, cache)
        gdnjit.gated_delta_rule_lazy_fold(pool, idx2, cache)
    torch.cuda.synchronize()
    print(f"lazy plain steps and a fold, rows form, {B2} rows x {H2} key heads: ran")
    # the same plain steps as the rules give them: the tile form a chunk at a time
    for _ in range(2):
        q, k = r(B2, 1, H2, K).bfloat16(), r(B2, 1, H2, K).bfloat16()
        v, a, b = r(B2, 1, 2 * H2, V).bfloat16(), r(B2, 1, 2 * H2).bfloat16(), r(B2, 1, 2 * H2).bfloat16()
        gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log.repeat(8), a, dtb.repeat(8), b, pool, idx2, cache)
    torch.cuda.synchronize()
    print(f"lazy plain steps, the rules' form, {B2} rows x {H2} key heads: ran")
    # T 8: the window's keys after chunk 0's dots (late_keys)
    tile_speculative(g, idx, A_log, dtb, torch.bfloat16, 6, "a chunk at a time")
    rows_speculative(g, idx, A_log, dtb)
    tile_speculative(g, idx, A_log, dtb, torch.float32, 8, "tile form of 128 rows, fp32 state and rings")
    # FlashInfer's calls at T = 4 and T = 1 (the tile form at this batch): rows 0 and 2 fold at T = 4 (hist_len >=
    # flush_min = 13), row 2 at T = 1 (>= 16); bases that wrap the ring
    pool = (r(S, HV, 128, 128) * 0.1).bfloat16()
    for T, rows, flush, force in ((4, 32, True, None), (4, 32, True, CHUNKED), (8, 32, True, CHUNKED),
                                  (4, 16, False, None), (1, 32, True, None), (1, 16, False, None)):
        q, k = r(B, T, H, 128).bfloat16(), r(B, T, H, 128).bfloat16()
        v, a, b = r(B, T, HV, 128).bfloat16(), r(B, T, HV).bfloat16(), r(B, T, HV).bfloat16()
        kc = (r(S, H, rows, 128) * 0.05).bfloat16()
        uc = (r(S, HV, rows, 128) * 0.05).bfloat16()
        gc = -torch.rand(S, HV, rows, device=DEV, generator=g).cumsum(-1)
        if flush:
            hist = torch.tensor([13, 12, 16, 0, 5], dtype=torch.int32, device=DEV)
            base = torch.tensor([28, 5, 30, 0, 17], dtype=torch.int32, device=DEV)
            with forcing(force):
                gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, q=q, k=k, v=v, b=b, initial_state_source=pool,
                                                         initial_state_indices=idx, k_cache=kc, u_cache=uc, g_cache=gc,
                                                         hist_len=hist, cache_base=base)
        else:
            hist = torch.tensor([0, 5, 12, 12, 3], dtype=torch.int32, device=DEV)
            gdnjit.gated_delta_rule_mtp_ucache(A_log, a, dtb, q=q, k=k, v=v, b=b, initial_state_source=pool,
                                               initial_state_indices=idx, k_cache=kc, u_cache=uc, g_cache=gc,
                                               hist_len=hist)
        torch.cuda.synchronize()
        print(f"FlashInfer u-cache {'verify+flush' if flush else 'verify only'}, T={T}"
              f"{'' if force is None else ', a chunk at a time'}: ran")
    print("OK")
    return 0


def rows_speculative(g: torch.Generator, idx: torch.Tensor, A_log: torch.Tensor, dtb: torch.Tensor) -> None:
    """An fp32 state and rings' speculative steps at T = 2 and 3 in the rows form (its prep and state launches with
    pending rows), random accepted counts, until every slot has folded in a step; a fold; then FlashInfer's verify+flush
    call at T = 2 in the rows form (rows 0 and 2 fold)."""
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    with forcing(ROWS_F32):
        for T in (2, 3):
            pool = (r(S, HV, V, K) * 0.1).float()
            cache = gdnjit.lazy_cache(S, H, HV, K, V, dtype=torch.float32, device=DEV)
            acc = torch.zeros(B, dtype=torch.int32, device=DEV)
            for _ in range(12):
                q, k = r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16()
                v, a, b = r(B, T, HV, V).bfloat16(), r(B, T, HV).bfloat16(), r(B, T, HV).bfloat16()
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc)
                acc = torch.randint(1, T + 1, (B,), device=DEV, generator=g, dtype=torch.int32)
            gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache, num_accepted=acc)
            torch.cuda.synchronize()
            print(f"lazy speculative steps (T={T}) and a fold, rows form, fp32 state and rings: ran")
        T = 2
        pool = (r(S, HV, V, K) * 0.1).float()
        q, k = r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16()
        v, a, b = r(B, T, HV, V).bfloat16(), r(B, T, HV).bfloat16(), r(B, T, HV).bfloat16()
        kc, uc = r(S, H, 32, K) * 0.05, r(S, HV, 32, V) * 0.05
        gc = -torch.rand(S, HV, 32, device=DEV, generator=g).cumsum(-1)
        hist = torch.tensor([15, 12, 16, 0, 5], dtype=torch.int32, device=DEV)
        base = torch.tensor([28, 5, 30, 0, 17], dtype=torch.int32, device=DEV)
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, q=q, k=k, v=v, b=b, initial_state_source=pool,
                                                 initial_state_indices=idx, k_cache=kc, u_cache=uc, g_cache=gc,
                                                 hist_len=hist, cache_base=base)
        torch.cuda.synchronize()
        print("FlashInfer u-cache verify+flush, T=2, rows form, fp32 state and rings: ran")


def tile_speculative(g: torch.Generator, idx: torch.Tensor, A_log: torch.Tensor, dtb: torch.Tensor,
                     dtype: torch.dtype, steps: int, what: str) -> None:
    """Speculative steps at T = 4 and 8 in the tile form of 128 rows, state and rings of ``dtype`` (16-bit: a chunk
    at a time; fp32: the whole tile staged, a thread a row), random accepted counts, until every slot has folded in a
    step; then a fold."""
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    with forcing(CHUNKED):
        for T in (4, 8):
            pool = (r(S, HV, 128, 128) * 0.1).to(dtype)
            cache = gdnjit.lazy_cache(S, H, HV, 128, 128, dtype=dtype, device=DEV)
            acc = torch.zeros(B, dtype=torch.int32, device=DEV)
            for _ in range(steps):
                q, k = r(B, T, H, 128).bfloat16(), r(B, T, H, 128).bfloat16()
                v, a, b = r(B, T, HV, 128).bfloat16(), r(B, T, HV).bfloat16(), r(B, T, HV).bfloat16()
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc)
                acc = torch.randint(T // 2, T + 1, (B,), device=DEV, generator=g, dtype=torch.int32)
            gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache, num_accepted=acc)
            torch.cuda.synchronize()
            print(f"lazy speculative steps (T={T}) and a fold, {what}: ran")

if __name__ == "__main__":
    raise SystemExit(main())
