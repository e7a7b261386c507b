"""NVFP4 quantization kernels on the GPU against the torch reference, byte for byte (run on the device:
pytest -m gpu tests/ops/test_nvfp4_gpu.py).

Every case draws fresh random inputs with a spread of block maxima (zero blocks, -0.0 blocks, huge and
tiny blocks, spikes, subnormals), poisons both outputs with 0xFF before the launch, and requires the
packed codes and the whole scale buffer (padding included) to equal the reference exactly.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import gdnjit
from gdnjit import nvfp4
from gdnjit.runner import RUNNER, device_info
from gdnjit import expr as _expr
from gdnjit.reference.nvfp4 import dequantize_reference, e4m3_decode, quantize_reference
from gdnjit.sf_layout import SfLayout, sf_offsets
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
LAYOUTS = (SfLayout.layout_128x4, SfLayout.layout_8x4, SfLayout.layout_linear)
# exponent range of the per-block magnitudes (randn * 2^e / 4 stays finite in the dtype)
EXP_RANGE = {"fp16": (-24, 15), "bf16": (-100, 100), "fp8": (-10, 8)}
MAX = {"fp16": 60000.0, "bf16": 1e38, "fp8": 448.0}


def make_input(M: int, K: int, dtype: str, seed: int, device="cuda") -> torch.Tensor:
    """[M, K] with per-block magnitudes log-uniform over the dtype's range, and special blocks."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = K // 16
    x = torch.randn(M, n, 16, generator=g, device=device)
    lo, hi = EXP_RANGE[dtype]
    e = torch.randint(lo, hi + 1, (M, n, 1), generator=g, device=device).float()
    x = x * torch.exp2(e) / 4
    kind = torch.randint(0, 16, (M, n), generator=g, device=device)
    x[kind == 0] = 0.0                        # zero block: sf 0
    x[kind == 1] = -0.0                       # negative zeros: codes 0x8
    x[kind == 2] *= 2.0 ** -40                # tiny next to normal blocks (sf underflow / subnormal e4m3)
    spike = kind == 3                         # one large element, the rest round to zero
    x[spike] *= 2.0 ** -12
    x[spike, 0] = torch.exp2(e[spike, 0]) * 3
    x[kind == 4] = torch.exp2(e[kind == 4]) * 0.75  # all equal: every element is amax
    x = x.clamp(-MAX[dtype], MAX[dtype])
    return x.view(M, K).to(DTYPES[dtype])


def global_scale(a: torch.Tensor, mode: str):
    """The global scale in one of four regimes, as a device tensor or a Python float."""
    amax = a.float().abs().nan_to_num(0.0).amax().clamp_min(1e-30)
    if mode == "recipe-tensor":               # the usual 448 * 6 / amax, never read on the host
        return (448.0 * 6.0 / amax).reshape(1)
    if mode == "recipe-float":
        return float(448.0 * 6.0 / amax)
    if mode == "huge":                        # most scales saturate at 448
        return 2.0 ** 40
    return 2.0 ** -30                         # "tiny": most scales round to 0 (codes 0x0 / 0x8)


def run_poisoned(a, gs, layout, recipe="fast"):
    """The public call's exact path (validation, allocation, dispatch, launch) with 0xFF-filled outputs."""
    fp4, sf, call = nvfp4.prepare(a, gs, layout, recipe=recipe)
    fp4.fill_(0xFF)
    sf.fill_(0xFF)
    if call is not None:
        RUNNER.launch(call)
    return fp4, sf


def check(got, ref, what: str):
    fp4, sf = got
    rfp4, rsf = ref
    assert fp4.shape == rfp4.shape and sf.shape == rsf.shape, f"{what}: shapes {fp4.shape} {sf.shape}"
    bad = (fp4 != rfp4).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.shape[0]} packed bytes differ, first at {bad[:5].tolist()}: "
                              f"got {fp4[tuple(bad[0])].item():#04x}, want {rfp4[tuple(bad[0])].item():#04x}")
    bad = (sf != rsf).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.shape[0]} scale bytes differ (padding included), first at "
                              f"{bad[:5].tolist()}: got {sf[tuple(bad[0])].item():#04x}, want {rsf[tuple(bad[0])].item():#04x}")


CASES = list(itertools.product(DTYPES, LAYOUTS, (1, 3, 127, 128, 1000, 4096), (16, 48, 64, 2048, 7168)))
GS_MODES = ("recipe-tensor", "recipe-float", "huge", "tiny")


@pytest.mark.parametrize("dtype,layout,M,K", CASES, ids=[f"{d}-{l.name[7:]}-M{m}-K{k}" for d, l, m, k in CASES])
def test_matches_reference_bit_exact(dtype, layout, M, K):
    i = CASES.index((dtype, layout, M, K))
    a = make_input(M, K, dtype, seed=1000 + i)
    for mode in (GS_MODES[i % 2], GS_MODES[2 + (i // 2) % 2]):  # a recipe scale and an extreme one
        gs = global_scale(a, mode)
        for recipe in ("fast", "exact"):
            check(run_poisoned(a, gs, layout, recipe), quantize_reference(a, gs, layout, recipe),
                  f"{dtype} {layout.name} M={M} K={K} {mode} {recipe}")


UNLISTED_K = [(64, 7680), (5, 80), (130, 16 * 997), (3, 2**20)]  # not in the spec's K list: compiled on first use


@pytest.mark.parametrize("M,K", UNLISTED_K, ids=[f"M{m}-K{k}" for m, k in UNLISTED_K])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_unlisted_k_matches_reference_bit_exact(M, K, dtype):
    assert K not in get_spec("nvfp4_quantize").allowed("K")
    a = make_input(M, K, dtype, seed=K + M)
    for layout in LAYOUTS:
        gs = global_scale(a, "recipe-tensor")
        check(run_poisoned(a, gs, layout), quantize_reference(a, gs, layout), f"{dtype} {layout.name} M={M} K={K}")
    fp4, sf = gdnjit.nvfp4_quantize(a, global_scale(a, "recipe-float"))  # the public call, default layout
    assert fp4.shape == (M, K // 2)


def test_special_values_cpu_reference():
    """NaN / Inf / all-NaN blocks / signed zeros against the reference run on the CPU (the decisions in
    reference/nvfp4.py). The kernel takes every code's sign from the input element's bits and maps NaN to
    magnitude 6 before any conversion instruction, so NaN elements compare exactly too."""
    for dtype in DTYPES:
        a = make_input(64, 256, dtype, seed=7).float()
        a[0, :16] = float("nan")                                  # all-NaN block: sf 0x7F, codes 0x7/0xF
        a[1, 3] = float("nan")                                    # NaN inside a finite block: skipped by amax
        a[2, 5] = -float("nan")
        a[3, :16] = -0.0
        a[4, 16:32] = torch.tensor([-0.01] * 15 + [4.0])          # negatives rounding to zero: 0x8
        if dtype != "fp8":
            a[5, 7] = float("inf")                                # Inf: sf 448, code 7
            a[6, 40] = -float("inf")
        a = a.to(DTYPES[dtype]).cuda()
        for layout, recipe in itertools.product(LAYOUTS, ("fast", "exact")):
            for gs in (1.0, 448.0 * 6.0 / 1000.0, torch.tensor([0.37], device="cuda")):
                got = run_poisoned(a, gs, layout, recipe)
                ref = quantize_reference(a.cpu(), gs.cpu() if isinstance(gs, torch.Tensor) else gs, layout, recipe)
                check(tuple(t.cpu() for t in got), ref, f"specials {dtype} {layout.name} gs={gs} {recipe}")


def test_public_api_strided_and_batched_inputs():
    base = make_input(300, 4096 + 64, "bf16", seed=3)
    a = base[:, 32:32 + 4096]                    # row stride 4160 elements, 16-byte aligned
    gs = global_scale(a, "recipe-tensor")
    check(gdnjit.nvfp4_quantize(a, gs), quantize_reference(a, gs), "strided rows")
    a3 = make_input(6 * 50, 2048, "fp16", seed=4).view(6, 50, 2048)
    for layout in LAYOUTS:
        check(gdnjit.nvfp4_quantize(a3, 2.5, layout), quantize_reference(a3, 2.5, layout), f"3-D {layout.name}")
    fp4, sf = gdnjit.nvfp4_quantize(a3[:0], 1.0)
    assert fp4.shape == (0, 1024) and sf.shape == (0, 128)


def test_every_tunable_matches():
    """Variants the rules do not pick today (blocks_per_thread 4, every CTA size) are still exact."""
    spec = get_spec("nvfp4_quantize")
    dev = torch.cuda.current_device()
    arch = device_info(dev).arch
    hw = int(arch[3:].rstrip("af")) >= 100
    for dtype, K, layout in itertools.product(DTYPES, (64, 2048), LAYOUTS):
        a = make_input(130, K, dtype, seed=K)
        gs = global_scale(a, "recipe-float")
        ref = quantize_reference(a, gs, layout)
        params = dict(in_dtype={"fp8": "fp8e4m3"}.get(dtype, dtype), sf_layout=nvfp4._LAYOUT_PARAM[layout], K=K,
                      hw_e2m1=hw, pdl=False, recipe="fast", scale="tensor", four_over_six="off")
        for tun, pdl in itertools.product(spec.all_tunable_choices(), (False, True)):
            params["pdl"] = pdl
            if spec.violations(params, tun):
                continue
            variant = Variant.make(spec, params, tun, arch)
            launcher = RUNNER.get_launcher(variant, dev)
            fp4, sf, call = nvfp4.prepare(a, gs, layout)
            fp4.fill_(0xFF)
            sf.fill_(0xFF)
            grid = _expr.evaluate(dict(spec.launch)["grid"], dict(variant.values, M=130, num_sms=1))
            launcher(int(grid), call.arg_values())
            check((fp4, sf), ref, variant.describe())


def test_round_trip_error_within_format_bound():
    """|dequant(quant(x)) - x| <= one scale step s = float(sf) / gs per block: e2m1 rounding is at most
    half a grid step (<= 1 at magnitudes 4..6, in units of s) and a scale rounded down by e4m3 (<= 1/16)
    saturates at most 6 * 1/16 < 1 step. Holds with the recipe scale (sf <= 448, normal e4m3)."""
    for dtype in ("bf16", "fp16"):
        g = torch.Generator(device="cuda").manual_seed(11)
        x = (torch.randn(512, 2048, generator=g, device="cuda") * torch.exp2(
            torch.randint(-4, 5, (512, 128, 1), generator=g, device="cuda").float()).repeat_interleave(16, -1)
             .view(512, 2048)).to(DTYPES[dtype])
        for layout in LAYOUTS:
            gs = global_scale(x, "recipe-tensor")
            fp4, sf = gdnjit.nvfp4_quantize(x, gs, layout)
            deq = gdnjit.dequantize_nvfp4(fp4, sf, gs, layout, 512, 2048)
            assert torch.equal(deq, dequantize_reference(fp4, sf, gs, layout, 512, 2048))
            scales = e4m3_decode(sf.view(-1)[sf_offsets(512, 128, layout, device="cuda").view(-1)]).view(512, 128, 1)
            step = (scales / gs.reshape(1, 1, 1)).expand(512, 128, 16).reshape(512, 2048)
            err = (deq - x.float()).abs()
            assert bool((err <= step * (1 + 1e-6)).all()), f"{dtype} {layout.name}: max err/step {(err / step).max()}"
            rel = (err.square().mean() / x.float().square().mean()).sqrt()
            assert rel < 0.15, f"{dtype} {layout.name}: relative rms error {rel}"


def test_cuda_graph_capture_and_replay():
    """Captured calls read the input and the device global scale at replay time (no host copies)."""
    a = make_input(1000, 7168, "bf16", seed=21)
    gs = global_scale(a, "recipe-tensor")
    nvfp4_quantize = gdnjit.nvfp4_quantize
    for layout in LAYOUTS:
        nvfp4_quantize(a, gs, layout)  # compile / load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = []
    with torch.cuda.graph(graph):
        for layout in LAYOUTS:
            outs.append(nvfp4_quantize(a, gs, layout))
    for step in range(3):
        a.copy_(make_input(1000, 7168, "bf16", seed=22 + step))
        gs.copy_(global_scale(a, "recipe-tensor") * (1.0 + step))
        for o in outs:
            o[0].fill_(0xFF)
            o[1].fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        for layout, o in zip(LAYOUTS, outs):
            check(o, quantize_reference(a, gs, layout), f"graph replay {step} {layout.name}")


def test_enable_pdl_back_to_back_reads_what_the_previous_kernel_wrote():
    """With programmatic dependent launch each quantize kernel may be scheduled while the previous
    kernel runs: it must still read the input the previous kernel wrote, for PDL on, off and auto,
    eagerly and replayed from a graph."""
    src = [make_input(2048, 4096, "bf16", seed=41 + i) for i in range(4)]
    a = torch.empty_like(src[0])
    for pdl in (True, False, None):
        outs = []
        for x in src:
            torch.mul(x, 1.0, out=a)  # the input is written by the kernel just before the quantize
            outs.append(gdnjit.nvfp4_quantize(a, 1.5, enable_pdl=pdl))
            outs.append(gdnjit.nvfp4_quantize(a, 0.5, enable_pdl=pdl))  # two PDL kernels back to back
        torch.cuda.synchronize()
        for i, x in enumerate(src):
            check(outs[2 * i], quantize_reference(x, 1.5), f"pdl={pdl} step {i}")
            check(outs[2 * i + 1], quantize_reference(x, 0.5), f"pdl={pdl} step {i} second")
    graph = torch.cuda.CUDAGraph()
    outs = []
    with torch.cuda.graph(graph):
        for x in src:
            torch.mul(x, 1.0, out=a)
            outs.append(gdnjit.nvfp4_quantize(a, 1.5, enable_pdl=True))
    for step in range(2):
        for x in src:
            x.mul_(-1.0 - step)
        graph.replay()
        torch.cuda.synchronize()
        for i, x in enumerate(src):
            check(outs[i], quantize_reference(x, 1.5), f"graph replay {step} step {i}")


def test_runs_on_the_current_stream():
    a = make_input(4096, 2048, "fp16", seed=31)
    ref = quantize_reference(a, 1.5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)  # the kernel must wait for this on the same stream
        got = gdnjit.nvfp4_quantize(a, 1.5)
    side.synchronize()
    check(got, ref, "side stream")


TE_SHAPES = [(1, 64), (1, 1024), (3, 128), (16, 64), (64, 128), (128, 64), (256, 128), (512, 256), (128, 1024),
             (1024, 2048), (128, 16384)]


@pytest.mark.parametrize("init", ["random", "boundary", "zeros", "maxes"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_exact_recipe_matches_the_transformer_engine_formula(dtype, init, monkeypatch):
    """FlashInfer's test_nvfp4_quantize_te_reference cases (its shapes, layouts and data kinds), selected the way
    FlashInfer selects the recipe (FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1, read per call), against the TE
    formula written independently (tests/te_nvfp4.py): codes and scale bytes, padding included."""
    from te_nvfp4 import te_quantize

    monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    for (M, K), layout in itertools.product(TE_SHAPES, LAYOUTS):
        g = torch.Generator(device="cuda").manual_seed(M * 31 + K)
        dt = DTYPES[dtype]
        if init == "random":
            x = torch.randn(M, K, device="cuda", generator=g).to(dt)
            x[0] = 0
        elif init == "boundary":
            base = torch.linspace(-12, 12, K, device="cuda").repeat(M, 1)
            x = (base + (torch.rand(M, K, device="cuda", generator=g) * 2e-3 - 1e-3)).to(dt)
        elif init == "zeros":
            x = torch.zeros(M, K, device="cuda", dtype=dt)
        else:
            x = torch.full((M, K), torch.finfo(dt).max, device="cuda", dtype=dt)
        amax = x.float().abs().max()
        gs = torch.clamp(448.0 * 6.0 / amax, max=torch.finfo(torch.float32).max).reshape(())
        gs = torch.where(gs == 0, torch.ones_like(gs), gs)
        got = gdnjit.nvfp4_quantize(x, gs, layout)
        check(got, te_quantize(x, gs, layout), f"TE {dtype} {init} M={M} K={K} {layout.name}")


# ---- FlashInfer's per-token scales and 4over6 search (docs/design.md 5.6, 5.7) ----

FOUR6 = [None, nvfp4.FourOverSix("mae"), nvfp4.FourOverSix("mse"), nvfp4.FourOverSix("mae", True),
         nvfp4.FourOverSix("mse", True, 256)]
F6_CASES = list(itertools.product(("fp16", "bf16"), LAYOUTS, ((1, 16), (3, 48), (130, 4096), (1000, 7168))))


def run_poisoned_token(a, gsi, layout, recipe, four6, row_map=None, out_scale=None):
    """The per-token call's exact path with poisoned outputs (0xFF codes / scales, NaN per-token scales): a row map
    zeroes them first (the rows it leaves out stay 0), so poison only without one."""
    fp4, sf, pts, call = nvfp4.prepare(a, gsi, layout, recipe=recipe, per_token=True, four_over_six=four6,
                                        row_map=row_map, out_scale=out_scale)
    if row_map is None:
        fp4.fill_(0xFF)
        sf.fill_(0xFF)
        pts.fill_(float("nan"))
    if call is not None:
        RUNNER.launch(call)
    return fp4, sf, pts


def check_token(got, ref, what: str):
    check(got[:2], ref[:2], what)
    assert torch.equal(got[2], ref[2]), f"{what}: per-token scales differ at {(got[2] != ref[2]).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("dtype,layout,shape", F6_CASES, ids=[f"{d}-{l.name[7:]}-M{s[0]}-K{s[1]}" for d, l, s in F6_CASES])
def test_per_token_and_four_over_six_match_reference_bit_exact(dtype, layout, shape):
    """Both forms, every 4over6 recipe (and none), both rounding recipes: codes, scale bytes (padding included) and
    per-token scales equal the reference; the inverse base scale as a float and as a device tensor."""
    M, K = shape
    i = F6_CASES.index((dtype, layout, shape))
    a = make_input(M, K, dtype, seed=3000 + i)
    if M > 1:
        a[0] = 0  # a zero row (its per-token scale is 0)
    for four6, recipe in itertools.product(FOUR6, ("fast", "exact")):
        e4m3_max = 448 if four6 is None else four6.e4m3_max
        what = f"{dtype} {layout.name} M={M} K={K} {four6} {recipe}"
        if four6 is not None:  # one global scale with the 4over6 search
            gs = global_scale(a, "recipe-tensor") * (e4m3_max / 448.0)
            got = nvfp4.prepare(a, gs, layout, recipe=recipe, four_over_six=four6)
            got[0].fill_(0xFF)
            got[1].fill_(0xFF)
            RUNNER.launch(got[2])
            check(got[:2], quantize_reference(a, gs, layout, recipe, four_over_six=four6), "tensor " + what)
        gsi = 1.0 / (e4m3_max * 6.0) if i % 2 else torch.tensor([1.0 / (e4m3_max * 6.0)], device="cuda")
        check_token(run_poisoned_token(a, gsi, layout, recipe, four6),
                    quantize_reference(a, gsi, layout, recipe, per_token=True, four_over_six=four6), "token " + what)


def test_per_token_row_map_out_scale_and_strided_rows():
    base = make_input(300, 2048 + 64, "bf16", seed=5)
    a = base[:, 32:32 + 2048]  # row stride 2112 elements
    g = torch.Generator(device="cuda").manual_seed(6)
    row_map = torch.randint(-1, 300, (320,), generator=g, device="cuda", dtype=torch.int32)
    for layout, four6 in itertools.product(LAYOUTS, (None, nvfp4.FourOverSix("mse"))):
        osc = torch.tensor([0.25], device="cuda")
        got = run_poisoned_token(a, 1 / 2688, layout, "exact", four6, row_map=row_map, out_scale=osc)
        ref = quantize_reference(a, 1 / 2688, layout, "exact", per_token=True, four_over_six=four6, row_map=row_map,
                                 out_scale=osc)
        check_token(got, ref, f"row map {layout.name} {four6}")
    # the public call returns the per-token scales too; without a map every row is written
    fp4, sf, pts = gdnjit.nvfp4_quantize(a, torch.tensor([1 / 2688], device="cuda"), per_token_activation=True)
    check_token((fp4, sf, pts), quantize_reference(a, 1 / 2688, per_token=True), "public per-token call")
    got = gdnjit.nvfp4_quantize(a, 1 / 2688, per_token_activation=True, out_scale=0.75)  # a number: a kernel argument
    check_token(got, quantize_reference(a, 1 / 2688, per_token=True, out_scale=0.75), "out_scale number")
    fp4, sf, pts = gdnjit.nvfp4_quantize(a[:0], 1 / 2688, per_token_activation=True)
    assert fp4.shape == (0, 1024) and pts.shape == (0,)


def test_per_token_out_of_range_row_map_traps():
    """An out-of-range row index stops the kernel (a sticky CUDA error) rather than writing out of bounds: run in a
    child process, whose context it poisons."""
    import subprocess
    import sys
    code = ("import torch, gdnjit\n"
            "a = torch.randn(4, 64, device='cuda', dtype=torch.bfloat16)\n"
            "m = torch.tensor([0, 1, 9, 2], device='cuda', dtype=torch.int32)\n"
            "gdnjit.nvfp4_quantize(a, 1 / 2688, per_token_activation=True, expanded_idx_to_permuted_idx=m)\n"
            "torch.cuda.synchronize()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and ("illegal instruction" in r.stderr or "unspecified launch failure" in r.stderr
                                  or "CUDA error" in r.stderr), r.stderr[-2000:]


def test_per_token_cuda_graph_capture_and_replay():
    a = make_input(500, 4096, "fp16", seed=51)
    gsi = torch.tensor([1 / 2688], device="cuda")
    four6 = nvfp4.FourOverSix("mae")
    gdnjit.nvfp4_quantize(a, gsi, per_token_activation=True, nvfp4_4over6=four6)  # compile / load first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gdnjit.nvfp4_quantize(a, gsi, per_token_activation=True, nvfp4_4over6=four6)
    for step in range(2):
        a.copy_(make_input(500, 4096, "fp16", seed=52 + step))
        for t in out:
            t.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        check_token(out, quantize_reference(a, gsi, per_token=True, four_over_six=four6), f"graph replay {step}")


def test_every_token_form_tunable_matches():
    """The per-token form at every CTA size (the rules take 128 and 512), with and without 4over6: bit-exact."""
    spec = get_spec("nvfp4_quantize")
    dev = torch.cuda.current_device()
    arch = device_info(dev).arch
    hw = int(arch[3:].rstrip("af")) >= 100
    for dtype, K, layout, four6 in itertools.product(("bf16", "fp16"), (48, 2048), LAYOUTS, (None, FOUR6[2])):
        a = make_input(130, K, dtype, seed=K + 7)
        ref = quantize_reference(a, 1 / 2688, layout, "exact", per_token=True, four_over_six=four6)
        params = dict(in_dtype=dtype, sf_layout=nvfp4._LAYOUT_PARAM[layout], K=K, hw_e2m1=hw, pdl=False,
                      recipe="exact", scale="token", four_over_six="off" if four6 is None else four6.param)
        for tun in spec.all_tunable_choices():
            if spec.violations(params, tun):
                continue
            variant = Variant.make(spec, params, tun, arch)
            launcher = RUNNER.get_launcher(variant, dev)
            fp4, sf, pts, call = nvfp4.prepare(a, 1 / 2688, layout, enable_pdl=False, recipe="exact", per_token=True,
                                                four_over_six=four6)
            fp4.fill_(0xFF)
            sf.fill_(0xFF)
            pts.fill_(float("nan"))
            grid = _expr.evaluate(dict(spec.launch)["grid"], dict(variant.values, M=130, num_sms=1))
            launcher(int(grid), call.arg_values())
            check_token((fp4, sf, pts), ref, variant.describe())
