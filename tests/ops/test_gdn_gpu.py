"""GDN kernels on the GPU against the float64 reference (run on the device: pytest -m gpu).

Every case draws fresh random inputs, poisons outputs (and the intermediate buffer) with NaN,
compares output, written slots and the intermediate buffer with the reference, and requires
every other slot (and the bytes between page-strided slots) to be bit-exactly untouched.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch

from gdn_cases import (KW_OVERRIDES, OVERRIDES, TC_OVERRIDE, Case, case_params, check, forced_tunables, forcing, run_case,
                       sampled_matrix)

pytestmark = pytest.mark.gpu

# ---- issue 2: T=1, fp32 K-last, direct and pooled --------------------------------------------
ISSUE2 = [
    Case(B=B, ratio=r, pool=pool, l2norm=l2, in_dtype=ind, out_dtype=outd, idx_dtype=idx)
    for B in (1, 3, 37, 128)
    for r in (1, 2, 4)
    for pool, idx in (("direct", "int32"), ("gaps", "int32"), ("gaps", "int64"))
    for l2, ind, outd in ((True, "bf16", "fp32"), (False, "fp16", None))
]


@pytest.mark.parametrize("case", ISSUE2, ids=lambda c: f"B{c.B}-r{c.ratio}-{c.pool}-{c.idx_dtype}-l2{int(c.l2norm)}-{c.in_dtype}")
def test_decode_t1_fp32_klast(case):
    check(case, run_case(case, seed=hash(case) & 0xFFFF))


# ---- T = 1 with H = 16: the small- and mid-batch rules (B * HV 16..256; docs/perf.md v15b, v16d) -------
T1_RULES = [
    Case(B=B, H=16, ratio=r, K=K, V=V, state_dtype=sd, pool=pool, out_dtype="bf16")
    for B, r in ((1, 1), (1, 4), (2, 4), (4, 2), (4, 4), (3, 3), (3, 4))
    for sd in ("fp32", "bf16")
    for pool in ("direct", "gaps")
    for K, V in ((128, 128), (64, 64), (128, 256))
]


@pytest.mark.parametrize("case", T1_RULES, ids=lambda c: f"B{c.B}-HV{c.HV}-{c.state_dtype}-{c.pool}-K{c.K}V{c.V}")
def test_decode_t1_batch_rules(case):
    check(case, run_case(case, seed=hash(case) & 0xFFFF))


# ---- T > 1, mid batch (B * HV 96..288, past the small-batch rules): the rules of docs/perf.md v15c, v16 ----------
MID_RULES = [
    Case(B=B, H=8, ratio=4, T=T, state_dtype=sd, pool=pool, inter_dtype=inter, update=inter is None, out_dtype="bf16")
    for B in (4, 8)
    for sd, pool, inter, Ts in (("fp32", "direct", None, (2, 3, 4, 8)), ("bf16", "gaps", None, (2, 3, 4, 5, 8)),
                                ("fp32", "gaps", "fp32", (2, 3, 4, 8)), ("bf16", "gaps", "bf16", (2, 3, 6)))
    for T in Ts
] + [  # v16: H = 16, HV = 48 (ratio 3): B * HV 96 / 144 / 288, the wave-count rules for fp32 T 4-8 and verify
    Case(B=B, H=16, ratio=3, T=T, state_dtype=sd, pool=pool, inter_dtype=inter, update=inter is None, out_dtype="bf16")
    for B in (2, 3, 6)
    for sd, pool, inter, Ts in (("fp32", "direct", None, (4, 7, 8)), ("fp32", "gaps", "fp32", (2, 4, 5)),
                                ("bf16", "gaps", None, (4,)))
    for T in Ts
]


@pytest.mark.parametrize("case", MID_RULES,
                         ids=lambda c: f"B{c.B}-HV{c.HV}-T{c.T}-{c.state_dtype}-{c.pool}-{'verify' if c.inter_dtype else 'mtp'}")
def test_multi_token_mid_batch_rules(case):
    check(case, run_case(case, seed=hash(case) & 0xFFFF))


# ---- issue 3: the sampled matrix -----------------------------------------------------------
MATRIX = sampled_matrix(260)


@pytest.mark.parametrize("case", MATRIX, ids=[f"m{i}" for i in range(len(MATRIX))])
def test_matrix(case):
    check(case, run_case(case, seed=random.Random(str(case)).randrange(1 << 30)))


# ---- CUDA graphs, scale, large offsets --------------------------------------------------------
def test_graph_capture_replays_with_new_inputs():
    import gdnjit

    torch.manual_seed(0)
    B, H, HV, K, V = 5, 2, 4, 128, 128
    dev = "cuda"
    q = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn(B, 1, HV, V, device=dev, dtype=torch.bfloat16)
    a = torch.randn(B, 1, HV, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    pool = torch.randn(9, HV, V, K, device=dev)
    idx = torch.tensor([3, -1, 0, 7, 5], device=dev, dtype=torch.int32)
    out = torch.empty(B, 1, HV, V, device=dev, dtype=torch.bfloat16)
    args = (q, k, v, None, A_log, a, dt_bias, b)
    kw = dict(output=out, initial_state=pool, initial_state_indices=idx)
    gdnjit.gated_delta_rule_decode_pretranspose(*args, **kw)  # warm (compile, load) outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gdnjit.gated_delta_rule_decode_pretranspose(*args, **kw)
    from gdnjit.reference.gdn import gdn_reference

    for _ in range(3):
        for t in (q, k, v, a, b):
            t.copy_(torch.randn_like(t))
        before = pool.clone()
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, before.double(), read_indices=idx)
        err = (out.double() - ref.output.to(torch.bfloat16).double()).norm() / ref.output.norm()
        assert err < 1e-3
        assert ((pool.double() - ref.state).norm() / ref.state.norm()) < 1e-3


EXTREME_GATES = [
    Case(layout=layout, B=5, T=T, state_dtype=sd, a_offset=off, pool="direct" if layout == "kmajor" else "gaps",
         out_dtype="fp32")
    for layout in ("klast", "kmajor") for T in (8, 16) for sd in ("fp32", "bf16") for off in (-8.0, 12.0, 40.0)
]


@pytest.mark.parametrize("case", EXTREME_GATES, ids=lambda c: f"{c.layout}-T{c.T}-{c.state_dtype}-a{c.a_offset:+g}")
def test_extreme_decay(case):
    """g near 1, g that drives the running decay below 1e-20 (the kernel applies it early), and g
    that underflows to 0: all must match the reference."""
    check(case, run_case(case, seed=int(case.a_offset) + 100 * case.T))


def test_scale_is_runtime():
    c1 = Case(B=3, pool="gaps", scale=0.37, out_dtype="fp32")
    check(c1, run_case(c1, seed=5))
    c2 = dataclasses.replace(c1, scale=1.9)
    check(c2, run_case(c2, seed=6))


@pytest.mark.big_memory
def test_large_pool_offsets_past_2_31_bytes():
    """9000 slots x HV=64 x 128 x 128 fp32 = 37.7 GB: slot offsets far past 2^31 elements and bytes."""
    import gdnjit

    dev = "cuda"
    n_slots, HV, H, K, V, B = 9000, 64, 16, 128, 128, 4
    pool = torch.empty(n_slots, HV, V, K, device=dev)
    slots = torch.tensor([8999, 17, 4500, -1], device=dev, dtype=torch.int64)
    for s in slots.tolist():
        if s >= 0:
            pool[s].normal_()
    torch.manual_seed(1)
    q = torch.randn(B, 1, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn(B, 1, HV, V, device=dev, dtype=torch.bfloat16)
    a = torch.randn(B, 1, HV, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    live = [0, 1, 2]
    before = pool[slots[live]].clone()
    out, _ = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b, initial_state=pool,
                                                         initial_state_indices=slots)
    from gdnjit.reference.gdn import gdn_reference

    ref = gdn_reference(q[live], k[live], v[live], A_log, a[live], dt_bias, b[live], before.double(),
                        read_indices=torch.arange(3, device=dev))
    assert ((out[live].double() - ref.output.to(torch.bfloat16).double()).norm() / ref.output.norm()) < 1e-3
    assert ((pool[slots[live]].double() - ref.state).norm() / ref.state.norm()) < 1e-3
    assert (out[3] == 0).all()
    del pool
    torch.cuda.empty_cache()


def test_intermediate_buffer_past_2_31_elements():
    """fp32 intermediate buffer [300, 8, 64, 128, 128] = 2.5e9 elements (FlashInfer crashes here)."""
    import gdnjit

    dev = "cuda"
    B, T, H, HV, K, V = 300, 8, 16, 64, 128, 128
    inter = torch.empty(B, T, HV, V, K, device=dev)
    inter[-1].fill_(float("nan"))
    pool = torch.randn(B + 1, HV, V, K, device=dev)
    idx = torch.arange(B, device=dev, dtype=torch.int32)
    torch.manual_seed(2)
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn(B, T, HV, V, device=dev, dtype=torch.bfloat16)
    a = torch.randn(B, T, HV, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    A_log = torch.rand(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    before = pool.clone()
    out, _ = gdnjit.gated_delta_rule_mtp(q, k, v, pool, idx, A_log, a, dt_bias, b, intermediate_states_buffer=inter,
                                         disable_state_update=True)
    torch.cuda.synchronize()
    assert torch.equal(pool, before)
    from gdnjit.reference.gdn import gdn_reference

    n = B - 1  # the last row: its buffer offsets are past 2^31 elements
    ref = gdn_reference(q[n:], k[n:], v[n:], A_log, a[n:], dt_bias, b[n:], before[n:n + 1].double(),
                        intermediate=inter[n:].double() * 0, disable_state_update=True)
    assert ((inter[n:].double() - ref.intermediate).norm() / ref.intermediate.norm()) < 1e-3
    assert ((out[n:].double() - ref.output.to(torch.bfloat16).double()).norm() / ref.output.norm()) < 1e-3
    del inter
    torch.cuda.empty_cache()


# ---- every multi-token kernel form, forced -----------------------------------------------------
FORM_CASES = [(c, name) for c in MATRIX if c.T > 1 for name in OVERRIDES][::2] + [
    (c, name) for c in EXTREME_GATES if c.layout == "klast" for name in OVERRIDES]


@pytest.mark.parametrize("case,kind", FORM_CASES, ids=[f"{k}-T{c.T}-{i}" for i, (c, k) in enumerate(FORM_CASES)])
def test_form_forced(case, kind):
    """The multi-token cases with the kernel form forced (whichever the dispatcher would pick), so
    every form the tuner may choose stays correct on shapes the rules do not send it."""
    from gdnjit.spec import get_spec

    if forced_tunables(get_spec("gdn"), case_params(case), {}, OVERRIDES[kind]) is None:
        pytest.skip(f"{kind}: no valid tunables for these params")
    with forcing(OVERRIDES[kind]):
        check(case, run_case(case, seed=random.Random(f"{kind}{case}").randrange(1 << 30)))


# ---- the tc form (bf16 q/k, bf16 / fp32 state, K = 128, T 3..8), forced over its whole domain ----
def _tc_cases() -> list[Case]:
    """Every value of every axis the tc form takes, crossed with T 2..8 (random pairing, fixed seed)."""
    rnd = random.Random(99)
    axes = {"T": [2, 3, 4, 5, 6, 7, 8], "pool": ["direct", "pool", "gaps", "split", "strided"], "neg_write": [False, True],
            "update": [True, False], "l2norm": [True, False], "out_dtype": [None, "bf16", "fp16", "fp32"],
            "dtb_dtype": ["fp32", "bf16", "fp16"], "idx_dtype": ["int32", "int64"], "B": [1, 3, 37, 130],
            "ratio": [1, 2, 3, 4], "V": [64, 128, 256], "scale": [None, 0.3], "state_dtype": ["bf16", "fp32"]}
    cases = []
    for axis, values in axes.items():
        for val in values:
            for _ in range(2):
                ch = {a: rnd.choice(v) for a, v in axes.items()}
                ch[axis] = val
                pool = ch["pool"]
                if not ch["update"] and pool == "split":
                    pool = "gaps"
                cases.append(Case(B=ch["B"], T=ch["T"], H=2 if ch["ratio"] < 3 else 1, ratio=ch["ratio"], V=ch["V"],
                                  out_dtype=ch["out_dtype"], state_dtype=ch["state_dtype"], dtb_dtype=ch["dtb_dtype"], pool=pool,
                                  idx_dtype=ch["idx_dtype"], neg_write=ch["neg_write"] and pool == "split",
                                  update=ch["update"] if pool != "direct" else True, l2norm=ch["l2norm"],
                                  scale=ch["scale"], api="mtp" if pool != "direct" and rnd.random() < 0.5 else "auto"))
    cases += [dataclasses.replace(c, T=T) for c in EXTREME_GATES if c.layout == "klast" for T in (3, 8)]
    return list(dict.fromkeys(cases))


TC_CASES = _tc_cases()


@pytest.mark.parametrize("case", TC_CASES, ids=[f"tc-T{c.T}-{i}" for i, c in enumerate(TC_CASES)])
def test_tc_form_forced(case):
    """The tc form on every option it takes (both state dtypes, pools, split / strided pools, negative
    indices, verify without a buffer, norms off, every output and dt_bias dtype, V 64..256, GVA, scale),
    extreme gates."""
    from gdnjit.spec import get_spec

    assert forced_tunables(get_spec("gdn"), case_params(case), {}, TC_OVERRIDE) is not None
    with forcing(TC_OVERRIDE):
        check(case, run_case(case, seed=random.Random(f"tc{case}").randrange(1 << 30)))


# a bf16 state's 128-row tiles (two 64-row blocks per warp): every bf16 case with V >= 128 (the verify without a
# writeback also in tests/ops/test_gdn_invariance_gpu.py, bit for bit against the 64-row tiles)
TC128_OVERRIDE = {"form": "tc", "tile_v": 128}
TC128_CASES = [c for c in TC_CASES if c.state_dtype == "bf16" and c.V >= 128]


@pytest.mark.parametrize("case", TC128_CASES, ids=[f"tc128-T{c.T}-{i}" for i, c in enumerate(TC128_CASES)])
def test_tc_form_forced_128_row_tiles(case):
    """The tc form's 128-row tiles on every bf16-state case of the tc grid that has them (V 128 / 256)."""
    from gdnjit.spec import get_spec

    assert forced_tunables(get_spec("gdn"), case_params(case), {}, TC128_OVERRIDE) is not None
    with forcing(TC128_OVERRIDE):
        check(case, run_case(case, seed=random.Random(f"tc128{case}").randrange(1 << 30)))


# ---- the row's K split across warps (k_warps), forced -----------------------------------------
KW_CASES = [(c, name) for c in MATRIX + EXTREME_GATES for name in KW_OVERRIDES][::7]


@pytest.mark.parametrize("case,kind", KW_CASES, ids=[f"{k}-T{c.T}-{i}" for i, (c, k) in enumerate(KW_CASES)])
def test_k_warps_forced(case, kind):
    """Cases of the matrix and the extreme gates with K split over 2, 4 or 8 warps (every seventh
    (case, kind) pair: each kind meets both layouts and every T, K, V and dtype the matrix has)."""
    from gdnjit.spec import get_spec

    if forced_tunables(get_spec("gdn"), case_params(case), {}, KW_OVERRIDES[kind]) is None:
        pytest.skip(f"{kind}: no valid tunables for these params")
    with forcing(KW_OVERRIDES[kind]):
        check(case, run_case(case, seed=random.Random(f"{kind}{case}").randrange(1 << 30)))


# ---- the bf16 verifies in 1-warp CTAs (the per-token scatter capped at 96 registers: gdn.yaml max_registers, v23) ----
VERIFY_1WARP = {"form": "recurrent", "pipe": 1, "lanes_per_row": 16, "ilp": 4, "tile_v": 8, "stage": False,
                "k_warps": 1}  # the verify rule's kind at B >= 32 (HV 64)
VERIFY_1WARP_CASES = [Case(B=(5, 37)[T % 2], T=T, H=2, ratio=(1, 2, 4, 3)[T % 4], state_dtype="bf16", pool="gaps",
                     inter_dtype=inter, cache_extra=2 * (T == 5), ssm=ssm, update=ssm is not None, out_dtype="bf16")
                for T in range(2, 9) for inter, ssm in (("bf16", None), (None, "int32"))]


@pytest.mark.parametrize("case", VERIFY_1WARP_CASES, ids=lambda c: f"T{c.T}-{'buffer' if c.inter_dtype else 'scatter'}")
def test_bf16_verify_1warp(case):
    """FlashInfer's verify (an intermediate buffer, or every token's state scattered through ssm_state_indices, whose
    registers gdn.yaml caps at 96) with a bf16 state in the 1-warp kind its rule picks at B >= 32: T 2..8."""
    from gdnjit.spec import get_spec

    assert forced_tunables(get_spec("gdn"), case_params(case), {}, VERIFY_1WARP) is not None
    with forcing(VERIFY_1WARP):
        check(case, run_case(case, seed=random.Random(f"capped{case}").randrange(1 << 30)))
