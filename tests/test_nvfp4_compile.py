"""NVFP4 quantization kernels on the CPU: every variant the dispatcher can select compiles with NVRTC
for sm_90 (software e2m1) and sm_100a (hardware e2m1) with no spills, no stack and no warnings; the
dispatcher / launch grid cover every row of the padded scale buffer; and the software e2m1 rounding
formula of the template equals the reference's rounding (a float64 emulation of its fp32 steps)."""

from __future__ import annotations

import itertools

import collections
import concurrent.futures
import time

import numpy as np
import pytest
import torch

from gdnjit import dispatch
from gdnjit import expr as _expr
from gdnjit.compile import CompileError
from gdnjit.reference.nvfp4 import e2m1_satfinite_rne
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

SPEC = get_spec("nvfp4_quantize")
TENSOR = dict(scale="tensor", four_over_six="off")  # one global scale, the plain NVFP4 search
ARCHS = (("sm_90", False), ("sm_100a", True))  # the op sets hw_e2m1 from the device arch


def selectable_tunables(params: dict) -> list[dict]:
    """Tunables of every rule the dispatcher can pick for ``params``: valid for them, and not shadowed by
    an earlier valid rule without ``when`` (rules with ``when`` are taken as satisfiable for some M)."""
    out = []
    for rule in SPEC.rules:
        use = dict(rule.use)
        if SPEC.violations(params, use):
            continue
        if use not in out:
            out.append(use)
        if rule.when is None:
            break
    return out


# K enters the kernel only as three constants (K, blocks per row, scale columns; pinned by
# test_k_changes_only_the_constants below), so the compile checks take K values covering what those
# constants change: every residue of K / 16 mod 4 (scale-column padding; which blocks_per_thread are
# valid), the smallest and the largest K, and the models' hidden sizes.
K_SAMPLE = (16, 32, 48, 64, 2048, 7168, 18944, 29568)


def all_selectable_variants() -> list[Variant]:
    variants = []
    for arch, hw in ARCHS:
        for in_dtype in SPEC.allowed("in_dtype"):
            for layout in SPEC.allowed("sf_layout"):
                for K in K_SAMPLE:
                    # the exact recipe changes only the per-block scale arithmetic, not the K constants:
                    # one K compiles it too (every layout, dtype, arch, pdl)
                    recipes = ("fast", "exact") if in_dtype != "fp8e4m3" and K == 7168 else ("fast",)
                    for pdl, recipe in itertools.product((False, True), recipes):
                        params = dict(in_dtype=in_dtype, sf_layout=layout, K=K, hw_e2m1=hw, pdl=pdl, recipe=recipe, **TENSOR)
                        for tun in selectable_tunables(params):
                            variants.append(Variant.make(SPEC, params, tun, arch))
        # FlashInfer's 4over6 search (both forms) and the per-token form: fp16 / bf16, both recipes, every layout; the
        # per-token form at a K with and without padding columns
        for in_dtype, layout, recipe, four6 in itertools.product(("fp16", "bf16"), SPEC.allowed("sf_layout"),
                                                                 ("fast", "exact"), SPEC.allowed("four_over_six")):
            for scale, K in (("tensor", 7168), ("token", 48), ("token", 7168)):
                if scale == "tensor" and four6 == "off":
                    continue  # above
                params = dict(in_dtype=in_dtype, sf_layout=layout, K=K, hw_e2m1=hw, pdl=True, recipe=recipe, scale=scale,
                              four_over_six=four6)
                for tun in selectable_tunables(params):
                    variants.append(Variant.make(SPEC, params, tun, arch))
    return variants


def test_k_sample_covers_the_constants_classes():
    allowed = SPEC.allowed("K")
    assert set(K_SAMPLE) <= set(allowed) and min(allowed) in K_SAMPLE and max(allowed) in K_SAMPLE
    assert {(K // 16) % 4 for K in K_SAMPLE} == {0, 1, 2, 3}


_K_LINES = ("// nvfp4_quantize: ", "//   blocks_per_thread=", "//   recipe=", "constexpr int K = ", "constexpr int NB = ",
            "constexpr int SF_COLS = ")


@pytest.mark.parametrize("arch,hw", ARCHS)
def test_k_changes_only_the_constants(arch, hw):
    """For every other param and tunable, two K values render sources that differ only in the lines that
    state K, the blocks per row and the scale columns: what the sampled compile checks rely on."""
    for in_dtype in SPEC.allowed("in_dtype"):
        for layout, pdl, scale in itertools.product(SPEC.allowed("sf_layout"), (False, True), SPEC.allowed("scale")):
            if scale == "token" and in_dtype == "fp8e4m3":
                continue  # (the template refuses it)
            for four6 in ("off", "mse_fp16") if in_dtype != "fp8e4m3" else ("off",):
                for tun in SPEC.all_tunable_choices():
                    if scale == "token" and tun["blocks_per_thread"] != 1:
                        continue
                    sources = []
                    for K in (64, 28672):  # both valid for every blocks_per_thread
                        params = dict(in_dtype=in_dtype, sf_layout=layout, K=K, hw_e2m1=hw, pdl=pdl, recipe="fast",
                                      scale=scale, four_over_six=four6)
                        assert not SPEC.violations(params, tun)
                        sources.append(Variant.make(SPEC, params, tun, arch).source().splitlines())
                    a, b = sources
                    assert len(a) == len(b)
                    diff = [(x, y) for x, y in zip(a, b) if x != y]
                    assert diff and all(x.startswith(_K_LINES) and y.startswith(_K_LINES) for x, y in diff), diff


COMPILE_SHARDS = 16  # the variants, split by stride: the default tier compiles one part, the full tier all


@pytest.mark.sample(1)
@pytest.mark.parametrize("shard", range(COMPILE_SHARDS))
def test_every_selectable_variant_compiles_clean(shard):
    variants = all_selectable_variants()[shard::COMPILE_SHARDS]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda v: v.build().meta, variants))
    elapsed = time.perf_counter() - t0
    bad = [(v.describe(), m["spill_bytes"], m["stack_bytes"], m["warnings"])
           for v, m in zip(variants, built) if m["spill_bytes"] or m["stack_bytes"] or m["warnings"]]
    assert not bad, f"variants with spills / stack / warnings: {bad[:10]}"
    regs = collections.defaultdict(set)
    for v, m in zip(variants, built):
        t = dict(v.tunables)
        p = dict(v.params)
        regs[(v.arch, p["in_dtype"], t["blocks_per_thread"])].add(m["registers"])
    summary = ", ".join(f"{a}/{d}/bpt{b}: {sorted(r)}" for (a, d, b), r in sorted(regs.items()))
    print(f"\n{len(variants)} nvfp4 variants (part {shard} of {COMPILE_SHARDS}) compiled in {elapsed:.1f} s (2 threads); registers {summary}")
    assert max(m["registers"] for m in built) <= 64  # full occupancy headroom at 256 threads per CTA


def test_rules_pick_valid_variants_and_grid_covers_the_padded_rows():
    launch = dict(SPEC.launch)
    for num_sms in (78, 132, 148):
        for in_dtype in ("bf16", "fp8e4m3"):
            for layout in SPEC.allowed("sf_layout"):
                for K in (16, 48, 64, 2048, 7168, 28672):
                    for M in (1, 3, 127, 128, 1000, 4096, 70000):
                        params = dict(in_dtype=in_dtype, sf_layout=layout, K=K, hw_e2m1=False, pdl=False, recipe="fast", **TENSOR)
                        tun, _ = dispatch.select(SPEC, params, dict(M=M, num_sms=num_sms))
                        assert tun in selectable_tunables(params)
                        values = SPEC.variant_values(params, tun)
                        ctx = dict(values, M=M, num_sms=num_sms)
                        grid = _expr.evaluate(launch["grid"], ctx)
                        row_pad = values["row_pad"]
                        sf_rows = -(-M // row_pad) * row_pad
                        threads = _expr.evaluate(launch["block"], ctx)
                        items = sf_rows * values["sf_cols"] // tun["blocks_per_thread"]  # scale-byte groups
                        assert grid * threads >= items
                        assert (grid - 1) * threads < items


def test_token_form_is_one_cta_per_padded_row():
    """The per-token form: one CTA per row of the padded scale buffer (the CTAs past the last row write the padding
    rows' zero scales), 128 threads a row, 512 for long rows when there is at most one row per SM."""
    launch = dict(SPEC.launch)
    for layout, K, M in itertools.product(SPEC.allowed("sf_layout"), (16, 48, 7168), (1, 3, 127, 128, 129, 70000)):
        params = dict(in_dtype="fp16", sf_layout=layout, K=K, hw_e2m1=False, pdl=True, recipe="exact", scale="token",
                      four_over_six="mae")
        tun, _ = dispatch.select(SPEC, params, dict(M=M, num_sms=132))
        assert tun == dict(blocks_per_thread=1, threads=512 if M <= 132 and K >= 16 * 256 else 128)
        values = SPEC.variant_values(params, tun)
        ctx = dict(values, M=M, num_sms=132)
        assert _expr.evaluate(launch["grid"], ctx) == -(-M // values["row_pad"]) * values["row_pad"]
        assert _expr.evaluate(launch["block"], ctx) == tun["threads"]


def _sf_coords(o: np.ndarray, layout: str, n: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The template's sf_coords(): (row, block column) of scale-byte offset o, transliterated."""
    if layout == "128x4":
        tile = o >> 9
        return (tile // (cols // 4)) * 128 + ((o >> 2) & 3) * 32 + ((o >> 4) & 31), (tile % (cols // 4)) * 4 + (o & 3)
    if layout == "8x4":
        tile = o >> 5
        return (tile // (cols // 4)) * 8 + ((o >> 2) & 7), (tile % (cols // 4)) * 4 + (o & 3)
    return o // n, o % n


@pytest.mark.parametrize("layout", ["128x4", "8x4", "linear"])
def test_thread_mapping_writes_every_scale_byte_once(layout):
    """The template's thread -> scale bytes -> blocks mapping, transliterated: thread t owns the BPT bytes
    at t * BPT of the padded buffer; the (row, column) it encodes for each is where the layout puts that
    block's scale (sf_layout.sf_offsets), BPT consecutive blocks of one row, all real or all padding; every
    byte is written exactly once and every block of the [M, K / 16] grid is encoded exactly once."""
    from gdnjit.sf_layout import padded_sf_shape, sf_offsets

    launch = dict(SPEC.launch)
    for K in (16, 48, 64, 96, 112 * 16, 7168):
        n = K // 16
        for M in (1, 3, 127, 128, 129, 1000):
            rows, cols = padded_sf_shape(M, n, layout)
            # offsets of every (row < padded rows, column < padded cols): the padded layout extends the formula
            table = sf_offsets(rows, cols, layout).numpy()
            for tun in SPEC.all_tunable_choices():
                bpt, threads = tun["blocks_per_thread"], tun["threads"]
                params = dict(in_dtype="bf16", sf_layout=layout, K=K, hw_e2m1=False, pdl=False, recipe="fast", **TENSOR)
                if SPEC.violations(params, tun):
                    continue
                values = SPEC.variant_values(params, tun)
                assert values["sf_cols"] == cols
                grid = _expr.evaluate(launch["grid"], dict(values, M=M, num_sms=132))
                o = np.arange(grid * threads, dtype=np.int64) * bpt
                o = o[o < rows * cols]  # the kernel's exit test
                r, c0 = _sf_coords(o, layout, n, cols)
                written = np.concatenate([o + j for j in range(bpt)])
                assert (np.bincount(written, minlength=rows * cols) == 1).all(), (layout, K, M, tun)
                for j in range(bpt):  # byte o + j is the scale of block (r, c0 + j)
                    assert (table[r, c0 + j] == o + j).all(), (layout, K, M, tun)
                real = (r < M) & (c0 < n)
                assert ((c0 + bpt <= n) | (c0 >= n)).all()  # never straddles the padding columns
                encoded = np.concatenate([r[real] * n + c0[real] + j for j in range(bpt)])
                assert (np.bincount(encoded, minlength=M * n) == 1).all() and encoded.size == M * n


def test_small_m_uses_small_ctas():
    params = dict(in_dtype="bf16", sf_layout="128x4", K=7168, hw_e2m1=False, pdl=False, recipe="fast", **TENSOR)
    small, _ = dispatch.select(SPEC, params, dict(M=1, num_sms=132))
    large, _ = dispatch.select(SPEC, params, dict(M=16384, num_sms=132))
    assert small["blocks_per_thread"] == 1 and small["threads"] == 64
    assert large["blocks_per_thread"] >= 1 and large != small


def test_hw_instruction_only_in_hw_variants():
    params = dict(in_dtype="bf16", sf_layout="128x4", K=64, pdl=False, recipe="fast", **TENSOR)
    tun = dict(blocks_per_thread=1, threads=128)
    sw = Variant.make(SPEC, dict(params, hw_e2m1=False), tun, "sm_90").source()
    hw = Variant.make(SPEC, dict(params, hw_e2m1=True), tun, "sm_100a").source()
    assert "e2m1x2" not in sw and "cvt.rn.satfinite.e2m1x2.f32" in hw
    with pytest.raises(CompileError) as info:  # the template refuses the instruction before sm_100
        Variant.make(SPEC, dict(params, hw_e2m1=True), tun, "sm_90").build()
    assert "hw_e2m1 needs sm_100a" in info.value.log


def test_pdl_wait_before_any_memory_access_from_sm_90():
    """The pdl variant waits for the previous grid (griddepcontrol.wait) before any global access;
    the other variants have no griddepcontrol at all; sm_89 has no such instruction."""
    params = dict(in_dtype="bf16", sf_layout="128x4", K=64, hw_e2m1=False, pdl=True, recipe="fast", **TENSOR)
    tun = dict(blocks_per_thread=1, threads=128)
    src = Variant.make(SPEC, params, tun, "sm_90").source()
    body = src[src.index("(const Args p) {"):]
    first_access = min(body.index(x) for x in ("p.sf", "p.x", "p.q", "p.gs_ptr"))
    assert body.index("griddepcontrol.wait;") < first_access
    assert "griddepcontrol.launch_dependents;" in body
    assert Variant.make(SPEC, params, tun, "sm_90").build().meta["spill_bytes"] == 0
    assert "griddepcontrol" not in Variant.make(SPEC, dict(params, pdl=False), tun, "sm_90").source()
    with pytest.raises(CompileError) as info:  # the template refuses it before sm_90
        Variant.make(SPEC, params, tun, "sm_89").build()
    assert "pdl needs sm_90" in info.value.log
    token = dict(params, scale="token", four_over_six="mse")  # the per-token form likewise
    body = Variant.make(SPEC, token, tun, "sm_90").source()
    body = body[body.index("(const Args p) {"):]
    assert body.index("griddepcontrol.wait;") < min(body.index(x) for x in ("p.sf", "p.x", "p.q", "p.gs_ptr", "p.perm"))
    assert "griddepcontrol" not in Variant.make(SPEC, dict(token, pdl=False), tun, "sm_90").source()


def test_the_templates_refuse_fp8_where_flashinfer_does():
    """fp8 input has neither per-token scales nor 4over6 (the op refuses both first)."""
    tun = dict(blocks_per_thread=1, threads=128)
    for extra, needle in ((dict(scale="token", four_over_six="off"), "per-token scales take fp16 / bf16"),
                          (dict(scale="tensor", four_over_six="mae"), "4over6 takes fp16 / bf16")):
        params = dict(in_dtype="fp8e4m3", sf_layout="128x4", K=64, hw_e2m1=False, pdl=False, recipe="fast", **extra)
        with pytest.raises(CompileError) as info:
            Variant.make(SPEC, params, tun, "sm_90").build()
        assert needle in info.value.log


@pytest.mark.parametrize("arch", ["sm_89", "sm_103a", "sm_120a"])
def test_other_targets_compile(arch):
    hw = arch != "sm_89"
    for in_dtype in SPEC.allowed("in_dtype"):
        meta = Variant.make(SPEC, dict(in_dtype=in_dtype, sf_layout="128x4", K=7168, hw_e2m1=hw, pdl=False, recipe="fast", **TENSOR),
                            dict(blocks_per_thread=2, threads=256), arch).build().meta
        assert meta["spill_bytes"] == 0 and not meta["warnings"]


def _sw_e2m1(v: np.ndarray) -> np.ndarray:
    """The template's e2m1_bits(): fp32 fma/add with 2^23 magic constants, min, & 7; the float64 sum is
    exact for |v| >= 2^-6 (so one rounding to float32 = the fma's single rounding), smaller |v| give 0."""
    a = np.abs(v.astype(np.float32)).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        r0 = (a * 2.0 + 8388608.0).astype(np.float32)
        r1 = (a + 8388610.0).astype(np.float32)
        r2 = (a * 0.5 + 8388612.0).astype(np.float32)
    m = np.fmin(np.fmin(np.fmin(r0, r1), r2), np.float32(8388615.0))  # fminf: NaN-skipping
    return (m.view(np.uint32) & 7).astype(np.uint8)


def test_software_e2m1_matches_reference_rounding():
    # every float32 within 4096 ulps of each rounding threshold and grid point, plus a random sample and specials
    points = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0]
    bits = [np.arange(int(np.float32(p).view(np.uint32)) - 4096, int(np.float32(p).view(np.uint32)) + 4096,
                      dtype=np.int64) for p in points]
    rng = np.random.default_rng(0)
    bits.append(rng.integers(int(np.float32(2**-6).view(np.uint32)), int(np.float32(64.0).view(np.uint32)),
                             size=2_000_000, dtype=np.int64))
    v = np.concatenate(bits).astype(np.uint32).view(np.float32)
    specials = np.array([0.0, -0.0, 2**-149, 1e-30, 2**-7, 1e3, 3e38, np.inf, -np.inf, np.nan, -6.0, -0.3],
                        dtype=np.float32)
    v = np.concatenate([v, -v, specials])
    ref = (e2m1_satfinite_rne(torch.from_numpy(v)) & 7).numpy()
    got = _sw_e2m1(v)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, f"mismatch at {v[bad[:10]]}: got {got[bad[:10]]}, want {ref[bad[:10]]}"

