"""``gated_delta_rule_mtp``'s state-recovery arguments (``gdnjit/recovery.py``: FlashInfer's ``accepted_steps``,
``recovery_steps``, ``disable_output``) on the GPU against the float64 reference, whose per-token write map is built
here token by token in Python. Every case poisons the output, compares every live row's outputs and every written
slot, and requires every other slot (and a discarded output) to be bit-exactly untouched. Beyond FlashInfer's own
tests (bf16 state, B * HV >= 128 for the fused mode): fp32 state, split pools, padding rows, int64 indices, the
per-token scatter with per-request steps, the torch op and a captured graph replayed with new steps. Outputs are fp32 with fp32 state (so the
check sees the state chain's error, not a bf16 output's rounding), bf16 with bf16 state."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import gdnjit
from gdn_cases import _rel, _state_err
from gdnjit.reference.gdn import gdn_reference

pytestmark = pytest.mark.gpu

DT = {"bf16": torch.bfloat16, "fp32": torch.float32}
H, K = 4, 128


@dataclasses.dataclass(frozen=True)
class RCase:
    mode: str  # "accepted" | "state_only" (accepted + disable_output) | "scatter" | "frozen" | "recovery"
    state_dtype: str
    B: int
    T: int
    HV: int = 8
    recovery: int = 0
    split: bool = False  # output_state_indices (write slots apart from the read slots)
    padding: bool = False  # one padding row (read slot -1)
    idx_dtype: str = "int32"
    torch_op: bool = False


CASES = [
    RCase(mode, sdt, B, T, HV=HV, split=split, padding=pad, idx_dtype=idx)
    for mode in ("accepted", "state_only", "scatter", "frozen")
    for sdt in ("bf16", "fp32")
    for B, T, HV, split, pad, idx in ((1, 2, 8, False, False, "int32"), (5, 4, 16, True, True, "int64"),
                                      (37, 8, 8, False, True, "int32"), (16, 3, 64, True, False, "int32"))
    if not (split and mode in ("scatter", "frozen"))
] + [
    RCase("recovery", sdt, B, T, HV=HV, recovery=R, split=split, padding=pad)
    for sdt in ("bf16", "fp32")
    for B, T, HV, R, split, pad in ((2, 4, 64, 1, False, False), (8, 8, 64, 7, True, True), (3, 5, 8, 5, False, True),
                                    (32, 4, 64, 2, False, False))
] + [RCase("accepted", "bf16", 8, 4, HV=64, torch_op=True), RCase("state_only", "fp32", 6, 6, torch_op=True),
      RCase("accepted", "bf16", 4, 1, padding=True), RCase("state_only", "fp32", 3, 1, split=True),
      RCase("scatter", "bf16", 5, 1)]


def _inputs(c: RCase, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    rng = random.Random(seed)
    dev, bf = "cuda", torch.bfloat16
    B, T, HV = c.B, c.T, c.HV
    idx = {"int32": torch.int32, "int64": torch.int64}[c.idx_dtype]
    slots = 2 * B + B * T + 3
    order = rng.sample(range(slots), slots)
    read = order[:B]
    if c.padding:
        read[rng.randrange(B)] = -1
    write = order[B:2 * B] if c.split else None
    ssm = [order[2 * B + n * T: 2 * B + (n + 1) * T] for n in range(B)] if c.mode == "scatter" else None
    acc = [rng.randrange(T) for _ in range(B)]
    return dict(
        q=torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g),
        k=torch.randn(B, T, H, K, device=dev, dtype=bf, generator=g),
        v=torch.randn(B, T, HV, K, device=dev, dtype=bf, generator=g),
        a=torch.randn(B, T, HV, device=dev, dtype=bf, generator=g),
        b=torch.randn(B, T, HV, device=dev, dtype=bf, generator=g),
        A_log=torch.rand(HV, device=dev, generator=g), dt_bias=torch.randn(HV, device=dev, generator=g),
        pool=(torch.randn(slots, HV, K, K, device=dev, generator=g) * 0.3).to(DT[c.state_dtype]),
        read=read, write=write, ssm=ssm, acc=acc, idx=idx,
        read_t=torch.tensor(read, dtype=idx, device=dev),
        write_t=None if write is None else torch.tensor(write, dtype=idx, device=dev),
        ssm_t=None if ssm is None else torch.tensor(ssm, dtype=idx, device=dev))


def _write_map(c: RCase, x: dict) -> list | None:
    """The reference's per-token write slots, token by token (None: no pool write at all)."""
    if c.mode == "frozen":
        return None
    rows = []
    for n in range(c.B):
        slot = (x["write"] or x["read"])[n]
        if c.mode == "recovery":
            rows.append([slot if t == c.recovery - 1 else -1 for t in range(c.T)])
        elif c.mode == "scatter":
            rows.append([x["ssm"][n][t] if t <= x["acc"][n] else -1 for t in range(c.T)])
        else:
            rows.append([slot if t == x["acc"][n] else -1 for t in range(c.T)])
    return rows


def _call(c: RCase, x: dict, pool: torch.Tensor, out: torch.Tensor, acc: torch.Tensor | None):
    kw = dict(output=out, disable_state_update=c.mode == "frozen", disable_output=c.mode == "state_only",
              output_state_indices=x["write_t"], ssm_state_indices=x["ssm_t"])
    if c.mode == "recovery":
        kw["recovery_steps"] = c.recovery
    else:
        kw["accepted_steps"] = acc
    fn = gdnjit.gated_delta_rule_mtp
    if c.torch_op:
        import gdnjit.torch_ops as ops
        fn = ops.gated_delta_rule_mtp
    return fn(x["q"], x["k"], x["v"], pool, x["read_t"], x["A_log"], x["a"], x["dt_bias"], x["b"], **kw)


def _check(c: RCase, x: dict, pool0: torch.Tensor, pool: torch.Tensor, out0: torch.Tensor, out: torch.Tensor,
           returned: torch.Tensor) -> None:
    rows = _write_map(c, x)
    ref = gdn_reference(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["dt_bias"], x["b"], pool0.double(),
                        read_indices=torch.tensor(x["read"]), disable_state_update=rows is None,
                        ssm_state_indices=None if rows is None else torch.tensor(rows))
    written = {s for n, r in enumerate(rows or []) if x["read"][n] >= 0 for s in r if s >= 0}
    live = [n for n in range(c.B) if x["read"][n] >= 0]
    for s in range(pool.shape[0]):
        if s in written:
            e = _state_err(pool[s], ref.state[s], c.state_dtype)
            assert e <= (1e-3 if c.state_dtype == "fp32" else 1.0), f"{c}: slot {s} error {e:.3g}"
        else:
            assert torch.equal(pool[s].view(torch.uint8), pool0[s].view(torch.uint8)), f"{c}: slot {s} was written"
    assert returned is out
    if c.mode == "state_only":
        assert torch.equal(out.view(torch.uint8), out0.view(torch.uint8)), f"{c}: disable_output wrote the output"
        return
    e = _rel(out[live].double(), ref.output[live])  # fp32 outputs with fp32 state: the chain's error, not a rounding's
    assert e <= (1e-3 if c.state_dtype == "fp32" else 8e-3), f"{c}: output error {e:.3g}"
    pad = [n for n in range(c.B) if x["read"][n] < 0]
    assert torch.equal(out[pad].view(torch.uint8), out0[pad].view(torch.uint8)), f"{c}: a padding row's output changed"


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"{c.mode}-{c.state_dtype}-B{c.B}-T{c.T}-HV{c.HV}-R{c.recovery}"
                         f"{'-split' if c.split else ''}{'-pad' if c.padding else ''}-{c.idx_dtype}"
                         f"{'-op' if c.torch_op else ''}")
def test_recovery_against_reference(c):
    x = _inputs(c, seed=random.Random(str(c)).randrange(1 << 30))
    pool0 = x["pool"].clone()
    out0 = torch.full((c.B, c.T, c.HV, K), float("nan"), dtype=DT[c.state_dtype], device="cuda")
    out = out0.clone()
    acc = torch.tensor(x["acc"], dtype=x["idx"], device="cuda")
    returned, _ = _call(c, x, x["pool"], out, acc)
    torch.cuda.synchronize()
    _check(c, x, pool0, x["pool"], out0, out, returned)


def test_recovery_in_a_captured_graph_follows_new_steps():
    """The write map is built on the device: a captured call replayed with new accepted_steps writes the new steps'
    states (as an eager call with them does, bit for bit)."""
    c = RCase("accepted", "bf16", 8, 4, HV=64)
    x = _inputs(c, seed=11)
    pool0 = x["pool"].clone()
    acc = torch.tensor(x["acc"], dtype=torch.int32, device="cuda")
    out = torch.empty(c.B, c.T, c.HV, K, dtype=torch.bfloat16, device="cuda")
    _call(c, x, x["pool"], out, acc)  # compile and warm outside the capture
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        _call(c, x, x["pool"], out, acc)
    torch.cuda.current_stream().wait_stream(s)
    new = [(a + 1) % c.T for a in x["acc"]]
    acc.copy_(torch.tensor(new, dtype=torch.int32))
    x["pool"].copy_(pool0)
    graph.replay()
    torch.cuda.synchronize()
    got_pool, got_out = x["pool"].clone(), out.clone()
    x["pool"].copy_(pool0)
    _call(c, x, x["pool"], out, torch.tensor(new, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(got_pool.view(torch.uint8), x["pool"].view(torch.uint8))
    assert torch.equal(got_out.view(torch.uint8), out.view(torch.uint8))
    x["acc"] = new
    _check(c, x, pool0, got_pool, out, got_out, got_out)
