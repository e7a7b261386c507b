"""Case generation and checking for the GDN GPU tests (shared by the issue-2 grid and the matrix)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random

import torch

from gdnjit.reference.gdn import gdn_reference
from gdnjit.tuned import SHIPPED_DIR
from gdnjit.gdn import NATIVE_CONVENTIONS

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Case:
    layout: str = "klast"
    B: int = 3
    T: int = 1
    H: int = 2
    ratio: int = 2  # HV // H
    K: int = 128
    V: int = 128
    in_dtype: str = "bf16"
    out_dtype: str | None = None  # None: let the op allocate (q's dtype)
    state_dtype: str = "fp32"
    dtb_dtype: str = "fp32"
    pool: str = "direct"  # direct | pool | gaps (pool with gaps + padding rows) | split | strided
    idx_dtype: str = "int32"
    neg_write: bool = False  # split pool: some write indices negative
    inter_dtype: str | None = None
    cache_extra: int = 0  # cache_steps = T + cache_extra
    ssm: str | None = None  # None | int32 | int64
    update: bool = True
    l2norm: bool = True
    scale: float | None = None
    a_offset: float = 0.0  # added to a: large values drive the decay g towards 0 (underflow), negative towards 1
    api: str = "auto"  # auto: pretranspose (klast, T=1 or pool), mtp, decode (kmajor)

    @property
    def HV(self):
        return self.H * self.ratio


def _ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    e = torch.floor(torch.log2(x.abs().clamp(min=1e-30)))
    return torch.pow(2.0, e - 7)


def run_case(c: Case, seed: int) -> dict:
    """Run one case on the GPU and compare everything against the float64 reference; returns errors."""
    import gdnjit

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    B, T, H, HV, K, V = c.B, c.T, c.H, c.HV, c.K, c.V
    ind = DT[c.in_dtype]

    def rnd(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)

    q = rnd(B, T, H, K, dtype=ind)
    k = rnd(B, T, H, K, dtype=ind)
    v = rnd(B, T, HV, V, dtype=ind)
    a = (rnd(B, T, HV) + c.a_offset).to(ind)
    b = rnd(B, T, HV, dtype=ind)
    A_log = torch.log(torch.rand(HV, generator=gen, device=dev) * 15 + 1).float()
    dt_bias = rnd(HV, dtype=DT[c.dtb_dtype])
    if not c.l2norm:  # keep magnitudes sane without normalisation
        q, k = (q.float() / math.sqrt(K)).to(ind), (k.float() / math.sqrt(K)).to(ind)
    trailing = (HV, V, K) if c.layout == "klast" else (HV, K, V)
    sdt = DT[c.state_dtype]
    block = HV * V * K

    direct = c.pool == "direct"
    read_idx = write_idx = ssm = None
    if direct:
        n_slots = B
    else:
        n_slots = 2 * B + 3 + (B * T if c.ssm else 0)
    slot_stride = block + (64 if c.pool == "strided" else 0)
    backing = rnd(n_slots * slot_stride, scale=0.5).to(sdt)
    pool = backing.as_strided((n_slots, *trailing), (slot_stride, trailing[1] * trailing[2], trailing[2], 1))
    if not direct:
        idt = DT_IDX[c.idx_dtype]
        perm = torch.randperm(n_slots, generator=gen, device=dev)
        read_idx = perm[:B].clone()
        if c.pool in ("gaps", "split", "strided") and B > 1:
            read_idx[torch.arange(B, device=dev) % 3 == 1] = -1  # padding rows
        if c.pool == "split":
            write_idx = perm[B:2 * B].clone()
            if c.neg_write and B > 1:
                write_idx[torch.arange(B, device=dev) % 4 == 2] = -1
            write_idx = write_idx.to(idt)
        read_idx = read_idx.to(idt)
        if c.ssm:
            ssm = perm[2 * B:2 * B + B * T].reshape(B, T).clone()
            ssm[0, 0] = -1
            ssm = ssm.to(DT_IDX[c.ssm])
    backing_orig = backing.clone()
    pool_orig = pool.clone()

    inter = None
    if c.inter_dtype:
        inter = torch.full((B + 1, T + c.cache_extra, *trailing), float("nan"), device=dev, dtype=DT[c.inter_dtype])
    output = None
    if c.out_dtype:
        output = torch.full((B, T, HV, V), float("nan"), device=dev, dtype=DT[c.out_dtype])

    ref = gdn_reference(q, k, v, A_log, a, dt_bias, b, pool_orig.double(), layout=c.layout, scale=c.scale,
                        use_qk_l2norm=c.l2norm, read_indices=read_idx, write_indices=write_idx,
                        intermediate=None if inter is None else inter.double(), ssm_state_indices=ssm,
                        disable_state_update=not c.update)

    # --- call ---
    keep_padding = False
    if c.layout == "kmajor":
        out, ret = gdnjit.gated_delta_rule_decode(q, k, v, pool, A_log, a, dt_bias, b, scale=c.scale, output=output,
                                                  use_qk_l2norm=c.l2norm)
    elif c.api == "mtp" or (not direct and (inter is not None or ssm is not None or not c.update)):
        keep_padding = output is not None  # FlashInfer's mtp: a caller's padding rows are left as they were
        out, ret = gdnjit.gated_delta_rule_mtp(q, k, v, pool, read_idx, A_log, a, dt_bias, b, scale=c.scale,
                                               output=output, intermediate_states_buffer=inter,
                                               ssm_state_indices=ssm, disable_state_update=not c.update,
                                               use_qk_l2norm=c.l2norm, output_state_indices=write_idx)
    elif direct:
        out, ret = gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, pool, A_log, a, dt_bias, b, scale=c.scale,
                                                               output=output, use_qk_l2norm=c.l2norm)
    else:
        keep_padding = output is not None and T > 1  # T > 1: mtp's convention; T = 1: zeros
        out, ret = gdnjit.gated_delta_rule_decode_pretranspose(
            q, k, v, None, A_log, a, dt_bias, b, scale=c.scale, output=output, use_qk_l2norm=c.l2norm,
            initial_state=pool, initial_state_indices=read_idx, output_state_indices=write_idx)
    torch.cuda.synchronize()
    if ret is not pool:
        raise AssertionError("the op must return the state/pool it updated in place")
    if output is not None and out is not output:
        raise AssertionError("the op must return the output tensor it was given")
    if out.dtype != (DT[c.out_dtype] if c.out_dtype else ind):
        raise AssertionError(f"output dtype {out.dtype}")

    errs = {}
    # Output: vs the reference rounded to the output dtype (one rounding), relative in norm. Padding rows of a
    # caller's output the op leaves alone must still hold the poison (NaN), and are left out of the norm.
    ref_out = ref.output.to(out.dtype).double()
    got = out.double()
    if keep_padding and read_idx is not None and bool((read_idx < 0).any()):
        pad = read_idx.long() < 0
        if not torch.isnan(out[pad]).all():
            raise AssertionError("padding rows of the caller's output were written (expected them left as they were)")
        got, ref_out = got[~pad], ref_out[~pad]
    errs["out"] = _rel(got, ref_out)
    if torch.isnan(got).any():
        errs["out"] = float("inf")

    # State: written slots within tolerance, every other slot and the page gaps bit-exact.
    written = set()
    if c.update:
        for n in range(B):
            r = int(read_idx[n]) if read_idx is not None else n
            if r < 0:
                continue
            if ssm is not None:
                written |= {int(x) for x in ssm[n].tolist() if int(x) >= 0}
            else:
                w = r if write_idx is None else int(write_idx[n])
                if w >= 0:
                    written.add(w)
    untouched = [s for s in range(n_slots) if s not in written]
    if untouched and not torch.equal(pool[untouched], pool_orig[untouched]):
        raise AssertionError("a slot that must not be written changed")
    if c.pool == "strided":
        gaps = backing.view(n_slots, slot_stride)[:, block:]
        if not torch.equal(gaps, backing_orig.view(n_slots, slot_stride)[:, block:]):
            raise AssertionError("bytes between page-strided slots changed")
    if written:
        wl = sorted(written)
        errs["state"] = _state_err(pool[wl], ref.state[wl], c.state_dtype)
    if inter is not None:
        live = [n for n in range(B) if read_idx is None or int(read_idx[n]) >= 0]
        got, exp = inter[live, :T], ref.intermediate[live, :T]
        errs["inter"] = _state_err(got, exp, c.inter_dtype)
        mask = torch.ones(inter.shape[:2], dtype=torch.bool, device=dev)
        mask[live, :T] = False
        if not torch.isnan(inter[mask].float()).all():
            raise AssertionError("intermediate buffer written outside [live rows, :T]")
    return errs


DT_IDX = {"int32": torch.int32, "int64": torch.int64}

# Multi-token kernel kinds the tuner can choose, by the tunables that define them.
OVERRIDES = {"recurrent": {"form": "recurrent", "pipe": 1}, "chunk": {"form": "chunk"}, "mma": {"form": "mma", "pipe": 1},
             "mma_pipe2": {"form": "mma", "pipe": 2}, "mma_pipe4": {"form": "mma", "pipe": 4},
             "pipe2": {"form": "recurrent", "pipe": 2}, "pipe4": {"form": "recurrent", "pipe": 4},
             "pipe8": {"form": "recurrent", "pipe": 8},  # the T = 3..6 rule's kind
             "lanes4x2": {"form": "recurrent", "pipe": 1, "lanes_per_row": 4, "ilp": 2}}  # the T >= 7 rule's
# the tc form (bf16 q/k, bf16 / fp32 state, K = 128, T 3..8): its own test grid (test_tc_form_forced); here for the sanitizer
TC_OVERRIDE = {"form": "tc"}
# K split across warps: every k_warps value the spec allows above 1
KW_OVERRIDES = {f"kwarps{w}": {"form": "recurrent", "pipe": 1, "k_warps": w} for w in (2, 4, 8)}


def case_params(c: Case) -> dict:
    """The gdn spec params a case's call has."""
    direct = c.pool == "direct"
    return {"layout": c.layout, "K": c.K, "V": c.V, "T": c.T, "in_dtype": c.in_dtype,
            "out_dtype": c.out_dtype or c.in_dtype, "state_dtype": c.state_dtype, "dtb_dtype": c.dtb_dtype,
            "pool": not direct, "idx_dtype": "int32" if direct else c.idx_dtype, "same_pool": c.pool != "split",
            "inter_dtype": c.inter_dtype or "none", "ssm_idx_dtype": c.ssm or "none", "update": c.update,
            "l2norm": c.l2norm, "slot_strided": False, **NATIVE_CONVENTIONS}


def forced_tunables(spec, params: dict, base: dict, override: dict) -> dict | None:
    """``base`` with ``override`` applied (and staging on) when valid, else the first valid candidate
    matching ``override``; None when no variant of that kind takes these params."""
    want = {**base, "stage": True, **override}  # an override may name stage itself
    if not spec.violations(params, want):
        return want
    return next((c for c in spec.all_tunable_choices()
                 if all(c[k] == v for k, v in override.items()) and not spec.violations(params, c)), None)


@contextlib.contextmanager
def forcing(override: dict):
    """Make the dispatcher pick a variant of the kind ``override`` names for every gdn call inside."""
    from gdnjit import runner
    from gdnjit.variant import Variant

    orig = runner.choose_variant

    def forced(spec, params, facts, arch, tuned=None, batch_invariant=False):
        v = orig(spec, params, facts, arch, tuned, batch_invariant)
        if spec.name != "gdn":
            return v
        tunables = forced_tunables(spec, params, dict(v.tunables), override)
        if tunables is None:  # (else Variant.make fails on None with an AttributeError that names nothing)
            raise ValueError(f"forcing {override}: no variant of that kind takes these params "
                             f"(T={params.get('T')}, state {params.get('state_dtype')}, K={params.get('K')})")
        return Variant.make(spec, params, tunables, arch)

    runner.RUNNER.clear()
    runner.choose_variant = forced
    try:
        yield
    finally:
        runner.choose_variant = orig
        runner.RUNNER.clear()


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    denom = ref.norm().item()
    return (x - ref).norm().item() / max(denom, 1e-30)


def _state_err(got: torch.Tensor, ref: torch.Tensor, dtype: str) -> float:
    """fp32: relative error in norm. bf16: worst |diff| in units of one bf16 ulp of the reference
    (plus an absolute floor of 1e-4 of the rms for values from cancellation), so <= 1 passes."""
    got, ref = got.double(), ref.double()
    if torch.isnan(got).any():
        return float("inf")
    if dtype == "fp32":
        return _rel(got, ref)
    rms = ref.pow(2).mean().sqrt()
    allowed = _ulp_bf16(ref) + 1e-4 * rms
    return ((got - ref).abs() / allowed).max().item()


WORST: dict[str, float] = {}  # worst error per (quantity, dtype), for the run report


def check(c: Case, errs: dict) -> None:
    tol_state = 1e-3
    for key, e in errs.items():
        dtype = {"out": c.out_dtype or c.in_dtype, "state": c.state_dtype, "inter": c.inter_dtype}[key]
        tag = f"{key}[{dtype}, state {c.state_dtype}]"
        WORST[tag] = max(WORST.get(tag, 0.0), e)
    for key, e in errs.items():
        if key == "out":
            limit = 1e-3 if c.state_dtype == "fp32" else 8e-3
        else:
            dtype = c.state_dtype if key == "state" else c.inter_dtype
            limit = tol_state if dtype == "fp32" else 1.0
        if not e <= limit:
            raise AssertionError(f"{c}: {key} error {e:.3g} > {limit}")


# ---- the sampled matrix of tests/ops/test_gdn_gpu.py (its coverage is checked on the CPU) ----------
def sampled_matrix(n: int, seed: int = 1234) -> list[Case]:
    """A sampled grid in which every value of every axis appears (first a sweep per axis, then random)."""
    rnd = random.Random(seed)
    axes = {
        "layout": ["klast", "kmajor"],
        "state_dtype": ["fp32", "bf16"],
        "T": [1, 2, 3, 4, 7, 8, 16],
        "KV": [(64, 64), (128, 128), (256, 256), (64, 128), (128, 256), (256, 64)],
        "pool": ["direct", "pool", "gaps", "split", "strided"],
        "neg_write": [False, True],
        "inter": [None, "fp32", "bf16"],
        "ssm": [None, "int32", "int64"],
        "update": [True, False],
        "l2norm": [True, False],
        "in_dtype": ["bf16", "fp16"],
        "out_dtype": [None, "bf16", "fp16", "fp32"],
        "dtb_dtype": ["fp32", "bf16", "fp16"],
        "idx_dtype": ["int32", "int64"],
        "B": [1, 3, 37, 130],
        "ratio": [1, 2, 3, 4],
        "cache_extra": [0, 3],
    }

    def make(choice: dict) -> Case | None:
        layout = choice["layout"]
        pool = choice["pool"]
        if layout == "kmajor":  # K-major API is direct-state decode only
            pool, choice = "direct", dict(choice, inter=None, ssm=None, update=True)
        if pool == "direct":
            choice = dict(choice, inter=None, ssm=None, update=True)
        if choice["ssm"]:
            choice = dict(choice, inter=None, update=True)
            if pool == "split":
                pool = "gaps"
        if not choice["update"] and pool == "split":
            pool = "gaps"
        K, V = choice["KV"]
        return Case(layout=layout, B=choice["B"], T=choice["T"], H=2 if choice["ratio"] < 3 else 1,
                    ratio=choice["ratio"], K=K, V=V, in_dtype=choice["in_dtype"], out_dtype=choice["out_dtype"],
                    state_dtype=choice["state_dtype"], dtb_dtype=choice["dtb_dtype"], pool=pool,
                    idx_dtype=choice["idx_dtype"], neg_write=choice["neg_write"] and pool == "split",
                    inter_dtype=choice["inter"], cache_extra=choice["cache_extra"], ssm=choice["ssm"],
                    update=choice["update"], l2norm=choice["l2norm"],
                    api="mtp" if (pool != "direct" and layout == "klast" and rnd.random() < 0.5) else "auto")

    cases = []
    for axis, values in axes.items():  # every axis value at least once
        for val in values:
            choice = {a: rnd.choice(v) for a, v in axes.items()}
            choice[axis] = val
            cases.append(make(choice))
    while len(cases) < n:
        cases.append(make({a: rnd.choice(v) for a, v in axes.items()}))
    return list(dict.fromkeys(cases))


# ---- shipped tuned-table entries (tests/ops/test_tuned_gpu.py; structure checked on the CPU) --------
def tuned_entries() -> list[tuple[str, dict, dict, dict]]:
    seen = {}
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for e in json.loads(path.read_text())["entries"]:
            if e["spec"] != "gdn":
                continue
            key = json.dumps([e["params"], e["tunables"]], sort_keys=True)
            seen.setdefault(key, (path.stem, e["params"], e["tunables"], e["facts"]))
    return list(seen.values())


def tuned_case(params: dict, facts: dict) -> Case:
    """A gdn_cases.Case with exactly these spec params (asserted), 5 rows, the entry's HV / H ratio."""
    pool = "direct" if not params["pool"] else ("pool" if params["same_pool"] else "split")
    c = Case(layout=params["layout"], B=5, T=params["T"], H=2, ratio=facts["HV"] // facts["H"], K=params["K"],
             V=params["V"], in_dtype=params["in_dtype"], out_dtype=params["out_dtype"],
             state_dtype=params["state_dtype"], dtb_dtype=params["dtb_dtype"], pool=pool,
             idx_dtype=params["idx_dtype"], inter_dtype=None if params["inter_dtype"] == "none" else params["inter_dtype"],
             ssm=None if params["ssm_idx_dtype"] == "none" else params["ssm_idx_dtype"], update=params["update"],
             l2norm=params["l2norm"])
    assert case_params(c) == params, f"a Case cannot express {params}"
    return c
