"""causal_conv1d_update on the GPU against the float64 reference (run on the device: pytest -m gpu
tests/ops/test_conv_gpu.py).

Each case draws fresh inputs, poisons the output before the launch, and compares the output within the
output dtype's rounding (the kernel accumulates in fp32, the reference in float64) and the whole pool
bit for bit (new columns are copies of old columns or of x in the state dtype; untouched slots and
columns must keep their bytes)."""

from __future__ import annotations

import zlib

import pytest
import torch

import gdnjit
import gdnjit.torch_ops as ops
from gdnjit import conv
from gdnjit import expr as _expr
from gdnjit.reference.conv import conv_reference
from gdnjit.runner import RUNNER, device_info
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

pytestmark = pytest.mark.gpu

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RTOL = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2e-6}
DTYPES = [("bf16", "bf16", "bf16"), ("fp16", "fp16", "fp16"), ("fp32", "fp32", "fp32"), ("bf16", "fp32", "bf16"),
          ("fp32", "bf16", "fp32"), ("fp16", "bf16", "fp32")]
MODES = ["decode", "multi", "spec", "varlen_spec", "varlen"]


def make_case(mode, dts, W, D, contig, seed, B=6, T=4, bias=True, pool=True, device="cuda"):
    """(kwargs for causal_conv1d_update, x) of one problem; the pool has gaps and spare slots."""
    g = torch.Generator(device=device).manual_seed(seed)
    xd, sd, wd = (DT[d] for d in dts)
    T = 1 if mode == "decode" else T
    spec_dec = mode in ("spec", "varlen_spec")
    cols = W - 2 + T if spec_dec else W - 1
    slots = 2 * B + 3
    if contig:  # vLLM's cache: [slots, cols, D] viewed as [slots, D, cols]
        state = torch.randn(slots, cols + 1, D, generator=g, device=device).to(sd).transpose(1, 2)[..., 1:]
    else:
        state = torch.randn(slots, D, cols + 2, generator=g, device=device).to(sd)[..., :cols + 1]
    kw = dict(conv_state=state, weight=(torch.randn(D, W, generator=g, device=device) / W).to(wd),
              bias=torch.randn(D, generator=g, device=device).to(wd) if bias else None)
    perm = torch.randperm(slots, generator=g, device=device)[:B]
    if pool:
        perm[1] = -1  # padding
        if B > 3:
            perm[3] = -7  # any negative index is padding too
        kw["conv_state_indices"] = perm.to(torch.int32 if seed % 2 else torch.int64)
    if mode.startswith("varlen"):
        lens = torch.randint(0, T + 1, (B,), generator=g, device=device)
        lens[0] = 0
        lens[-1] = T
        qsl = torch.zeros(B + 1, dtype=torch.int32, device=device)
        qsl[1:] = torch.cumsum(lens, 0)
        n = int(qsl[-1])
        x = torch.randn(n, D + 8, generator=g, device=device).to(xd)[:, 4:4 + D] if not contig else \
            torch.randn(n, D, generator=g, device=device).to(xd)
        kw.update(query_start_loc=qsl, max_query_len=T)
    elif mode == "decode":
        x = torch.randn(B, D, generator=g, device=device).to(xd)
    else:  # [B, D, T]: channels contiguous (a transposed view) or a token-contiguous copy
        x = torch.randn(B, T, D, generator=g, device=device).to(xd).transpose(1, 2)
        if not contig:
            x = x.contiguous()
    if spec_dec:
        hi = cols - (W - 1) + 1  # num_accepted up to state_len - W + 2 keeps the window inside the columns
        kw["num_accepted_tokens"] = torch.randint(1, hi + 1, (B,), generator=g, device=device, dtype=torch.int32)
    return kw, x


def check(x, kw, out, state_before, silu):
    ref_out, ref_state = conv_reference(x, state_before, kw["weight"], kw.get("bias"), silu,
                                        kw.get("conv_state_indices"), kw.get("num_accepted_tokens"),
                                        kw.get("query_start_loc"), kw.get("max_query_len", -1))
    # the output is rounded to the state dtype, then to x's (as vLLM does): the coarser of the two decides
    r = max(RTOL[x.dtype], RTOL[state_before.dtype])
    torch.testing.assert_close(out.double(), ref_out, rtol=r, atol=1e-5)
    assert torch.equal(kw["conv_state"], ref_state), "pool differs from the reference"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dts", DTYPES, ids=lambda d: "-".join(d))
@pytest.mark.parametrize("W", [2, 4, 6])
@pytest.mark.parametrize("contig", [True, False])
def test_against_float64_reference(mode, dts, W, contig):
    seed = zlib.crc32(repr((mode, dts, W, contig)).encode()) % 10_000
    D = 256 if contig else 100
    kw, x = make_case(mode, dts, W, D, contig, seed, bias=seed % 3 != 0)
    silu = seed % 2 == 0
    before = kw["conv_state"].clone()
    out = torch.full_like(x, float("nan"))
    got = gdnjit.causal_conv1d_update(x, activation="silu" if silu else None, out=out, **kw)
    assert got is out
    check(x, kw, out, before, silu)


@pytest.mark.parametrize("W", [3, 5])
@pytest.mark.parametrize("D", [8, 24, 1000, 12288, 4104])
def test_sizes_and_no_pool(W, D):
    kw, x = make_case("spec", ("bf16", "bf16", "bf16"), W, D, True, D + W, B=5, pool=False)
    before = kw["conv_state"].clone()
    out = gdnjit.causal_conv1d_update(x, activation=True, **kw)
    check(x, kw, out, before, True)


def test_every_tunable_choice():
    """Every valid (vec, threads) of two problems, launched directly: the rules' choice is one of many."""
    spec = get_spec(conv.SPEC)
    for mode, contig in (("varlen_spec", True), ("multi", False)):
        kw, x = make_case(mode, ("bf16", "fp32", "bf16"), 4, 200 if not contig else 264, contig, 11)
        before = kw["conv_state"].clone()
        out, call = conv.prepare(x, kw["conv_state"], kw["weight"], kw["bias"], "silu", kw.get("conv_state_indices"),
                                  kw.get("num_accepted_tokens"), kw.get("query_start_loc"),
                                  kw.get("max_query_len", -1), -1, None)
        arch = device_info(call.device).arch
        n = 0
        for tun in spec.all_tunable_choices():
            if not spec.valid(dict(call.params), tun):
                continue
            kw["conv_state"].copy_(before)
            out.fill_(float("nan"))
            variant = Variant.make(spec, dict(call.params), tun, arch)
            grid = _expr.evaluate(dict(spec.launch)["grid"], dict(variant.values, **call.facts, num_sms=1))
            RUNNER.get_launcher(variant, call.device)(grid, call.arg_values())
            check(x, kw, out, before, True)
            n += 1
        # vec * element bytes <= 16 (fp32 state: vec <= 4) x 4 thread counts; strided: vec 1 only
        assert n == (12 if contig else 4)


def test_in_place_and_pad_slot_id():
    kw, x = make_case("multi", ("bf16", "bf16", "bf16"), 4, 512, True, 5)
    before, x0 = kw["conv_state"].clone(), x.clone()
    idx = kw["conv_state_indices"]
    idx[2] = 1000  # pad_slot_id: padding though non-negative (and past the pool, which would stop the kernel)
    out = gdnjit.causal_conv1d_update(x, activation="swish", pad_slot_id=1000, out=x, **kw)
    assert out is x
    idx_ref = idx.clone()
    idx_ref[2] = -1
    check(x0, dict(kw, conv_state_indices=idx_ref), out, before, True)


def test_cuda_graph_of_several_steps_and_the_torch_op():
    """Three speculative steps captured in one CUDA graph, replayed on new inputs, against the reference
    stepped three times; then the same through torch.ops.gdnjit under torch.compile."""
    kw, x = make_case("spec", ("bf16", "bf16", "bf16"), 4, 384, True, 21)
    xs = [x.clone() for _ in range(3)]
    outs = [torch.empty_like(x) for _ in range(3)]
    gdnjit.causal_conv1d_update(xs[0], activation="silu", out=outs[0], **kw)  # compile + load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(3):
            gdnjit.causal_conv1d_update(xs[i], activation="silu", out=outs[i], **kw)
    for trial in range(2):
        for i in range(3):
            xs[i].copy_(torch.randn(xs[i].shape, device="cuda").to(x.dtype))
        before = kw["conv_state"].clone()
        graph.replay()
        state = before
        for i in range(3):
            ref_out, state = conv_reference(xs[i], state, kw["weight"], kw["bias"], True, kw["conv_state_indices"],
                                            kw["num_accepted_tokens"])
            torch.testing.assert_close(outs[i].double(), ref_out, rtol=RTOL[torch.bfloat16], atol=1e-5)
        assert torch.equal(kw["conv_state"], state)

    fn = torch.compile(lambda x, s: ops.causal_conv1d_update(x, s, kw["weight"], kw["bias"], "silu",
                                                             kw["conv_state_indices"], kw["num_accepted_tokens"]),
                       fullgraph=True)
    before = kw["conv_state"].clone()
    out = fn(xs[0], kw["conv_state"])
    check(xs[0], kw, out, before, True)


def test_check_indices_raises_on_the_host(cache_config):
    import dataclasses

    from gdnjit import config as _config

    _config.set_config(dataclasses.replace(cache_config, check_indices=True))
    kw, x = make_case("spec", ("bf16", "bf16", "bf16"), 4, 64, True, 3)
    bad = kw["conv_state_indices"].clone()
    bad[0] = kw["conv_state"].shape[0]
    with pytest.raises(IndexError, match="^conv_state_indices: index .* out of range"):
        gdnjit.causal_conv1d_update(x, **dict(kw, conv_state_indices=bad))
    acc = kw["num_accepted_tokens"].clone()
    acc[0] = 0
    with pytest.raises(IndexError, match="^num_accepted_tokens: expected 1.."):
        gdnjit.causal_conv1d_update(x, **dict(kw, num_accepted_tokens=acc))
