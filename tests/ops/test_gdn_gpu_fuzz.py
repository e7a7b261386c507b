"""Random GDN calls at model-like sizes against the float64 reference (run on the device: pytest -m gpu).

The matrix in test_gdn_gpu.py keeps heads few (HV <= 8) so that every axis value fits in a short
run; the dispatcher's rules and the tuned table, though, switch kernels on B * HV, T and the SM
count (pipelined items per CTA, small-batch tiles, the tensor-core form). Here each case draws a
real head layout (H up to 16, HV up to 64), a batch from 1 to 300 (odd sizes, tails of pipelined
CTAs), T from 1 to 16 and every option of the API, so the variants the dispatcher actually picks at
serving sizes meet the reference. Each case is checked exactly like the matrix (fresh random inputs,
NaN-poisoned outputs, untouched slots bit-exact).

    GDNJIT_TEST_GPU_FUZZ=400 GDNJIT_TEST_GPU_FUZZ_SEED=7 python3 -m pytest -m gpu tests/ops/test_gdn_gpu_fuzz.py

The default (40 cases, seed 0) keeps the file under a minute; the seed makes a failure reproducible.
"""

from __future__ import annotations

import os
import random

import pytest

from gdn_cases import Case, check, run_case

pytestmark = pytest.mark.gpu

N_CASES = int(os.environ.get("GDNJIT_TEST_GPU_FUZZ", "40"))
SEED = int(os.environ.get("GDNJIT_TEST_GPU_FUZZ_SEED", "0"))


def _fit(B: int, T: int, block: int, state_dtype: str, pool: str, ssm, inter) -> int:
    """The largest batch <= B whose pool, its clones and float64 copies (and the intermediate buffer)
    stay within ~6 GB (the reference and the error checks take about three times that), so every
    case also fits an H100 with room for a second process."""
    es = 4 if state_dtype == "fp32" else 2

    def need(b: int) -> int:
        slots = b if pool == "direct" else 2 * b + 3 + (b * T if ssm else 0)
        total = slots * block * (2 * es + 16)
        if inter:
            total += (b + 1) * (T + 2) * block * ((4 if inter == "fp32" else 2) + 16)
        return total

    while B > 1 and need(B) > 6 << 30:
        B = max(1, B * 3 // 4)
    return B


def _draw(rnd: random.Random) -> Case:
    layout = "kmajor" if rnd.random() < 0.15 else "klast"
    H = rnd.choice([16, 16, 16, 8, 4, 2, 1])
    ratio = rnd.choice([1, 2, 4, 4])
    K, V = rnd.choice([(128, 128)] * 6 + [(64, 64), (256, 256), (64, 128), (128, 256), (256, 64)])
    B = rnd.choice([rnd.randint(1, 8), rnd.randint(9, 64), rnd.randint(65, 300)])
    T = rnd.choice([1, 1, 2, 3, 4, 4, rnd.randint(5, 8), 8, rnd.randint(9, 16)])
    state_dtype = rnd.choice(["fp32", "fp32", "bf16"])
    pool = "direct" if layout == "kmajor" else rnd.choice(["direct", "pool", "gaps", "split", "strided"])
    ssm = inter = None
    update = True
    if pool != "direct":
        mode = rnd.choice(["plain", "plain", "verify", "ssm", "no_update"])
        if mode == "verify":
            inter, update = rnd.choice([state_dtype, "fp32", "bf16"]), False
        elif mode == "ssm":
            ssm = rnd.choice(["int32", "int64"])
        elif mode == "no_update":
            update = False
        if (ssm or not update) and pool == "split":
            pool = "gaps"
    B = _fit(B, T, H * ratio * K * V, state_dtype, pool, ssm, inter)
    return Case(
        layout=layout, B=B, T=T, H=H, ratio=ratio, K=K, V=V,
        in_dtype=rnd.choice(["bf16", "bf16", "fp16"]), out_dtype=rnd.choice([None, None, "bf16", "fp16", "fp32"]),
        state_dtype=state_dtype, dtb_dtype=rnd.choice(["fp32", "bf16", "fp16"]), pool=pool,
        idx_dtype=rnd.choice(["int32", "int64"]), neg_write=pool == "split" and rnd.random() < 0.5,
        inter_dtype=inter, cache_extra=rnd.choice([0, 0, 2]) if inter else 0, ssm=ssm, update=update,
        l2norm=rnd.random() < 0.85, scale=rnd.choice([None, None, 0.05, 0.3]),
        a_offset=rnd.choice([0.0, 0.0, 0.0, -8.0, 12.0]),
        api="mtp" if pool != "direct" and layout == "klast" and rnd.random() < 0.5 else "auto",
    )


_RND = random.Random(SEED)
CASES = [_draw(_RND) for _ in range(N_CASES)]


@pytest.mark.parametrize("case", CASES, ids=[f"s{SEED}-{i}" for i in range(len(CASES))])
def test_random_call_matches_reference(case):
    check(case, run_case(case, seed=random.Random(f"{SEED}{case}").randrange(1 << 30)))
