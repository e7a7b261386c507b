"""The lazy-state GDN on the GPU (gdnjit.lazy, gdnjit.ucache; docs/design.md section 11) against the float64
references of gdnjit/reference/lazy.py.

- Multi-step loops of gdnjit's own calls (step, fold, reset) against the LazyModel with the kernels' rounding points:
  every output, every checkpoint (unused slots and the other parts of a page-strided pool bit-exact), the live ring
  rows and the cursors, exactly; outputs poisoned (NaN) before the kernels run, rings poisoned at allocation (a row
  outside a window is never read); odd batch sizes, pools with gaps, padding rows (negative, vLLM's null block 0),
  page-strided pools and rings, bf16 / fp16 inputs, fp32 / bf16 / fp16 states and rings, K / V 64..256, GQA 1, 2, 4,
  T 1..16, plain and speculative (accept counts -1..T+1: clamped); both kernel forms: each case as the rules give it
  (rows for T <= 1 and folds at large batches, tile for T >= 2 and small plain batches) and in the tile form, and
  the rows form at 4, 8 and 16 lanes a row, 1, 2, 4 rows a lane and T up to 4 (window 8 too).
- Folds at every window length P = 0..16 (in a step, and explicit), fold-only and reset calls.
- A captured CUDA graph of a short loop (steps and a fold, two layers) gives the bits of the eager loop.
- Long runs against float64 sequential decoding (the ground truth): 1000 plain T = 1 steps and 200 speculative steps
  (T = 4, random accepts); the drift is printed; fp32 state within 1e-5 relative; a bf16 state drifts less than a
  plain bf16 decode (gdnjit.gated_delta_rule_decode_pretranspose) of the same stream.
- FlashInfer's u-cache drop-ins: gated_delta_rule_mtp_ucache_flush (per-row hist_len / cache_base, folds at
  hist_len >= flush_min, appends at (base + P + t) & 31, new rows' G local after a fold, restart_hist_on_flush's
  commit) and the verify-only gated_delta_rule_mtp_ucache (flat 16-row ring, the state never written).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import zlib
from typing import Optional

import pytest
import torch

import gdnjit
from gdnjit.reference.gdn import gdn_reference
from gdnjit.reference.lazy import LazyModel, sequential_decode, ucache_commit

pytestmark = pytest.mark.gpu

DEV = "cuda"
f32, bf, fp16 = torch.float32, torch.bfloat16, torch.float16
i32, i64 = torch.int32, torch.int64


# ---- helpers ---------------------------------------------------------------------------------------------------


def _rel(x, ref) -> float:
    """max |x - ref| / max |ref| (float64)."""
    x, ref = x.double(), ref.double().to(x.device)
    return (x - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def _tokens(g, B, T, H, HV, K, V, dt):
    r = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    return r(B, T, H, K).to(dt), r(B, T, H, K).to(dt), r(B, T, HV, V).to(dt), r(B, T, HV).to(dt), r(B, T, HV).to(dt)


def _gate_params(g, HV, dt=f32):
    """Model-like gates: A_log = log(U(1, 16)), dt_bias = softplus^-1(U(0.001, 0.1)) (decays ~0.8-0.999 a token)."""
    A_log = torch.log(1 + 15 * torch.rand(HV, device=DEV, generator=g))
    dt_ = 0.001 + 0.099 * torch.rand(HV, device=DEV, generator=g)
    return A_log.to(dt), torch.log(torch.expm1(dt_)).to(dt)


def _poisoned_cache(slots, H, HV, K, V, rdt, paged=False, layers=None):
    """A LazyCache whose rings hold NaN (cursors zero: empty rings); ``paged``: each slot's rings are the middle part
    of a 3-part page (slot stride 3x the slot's block); returns (cache, pages or None)."""
    if not paged:
        c = gdnjit.lazy_cache(slots, H, HV, K, V, dtype=rdt, device=DEV, layers=layers)
        for x in c[:3]:
            x.fill_(float("nan"))
        return c, None
    pages = [torch.full((slots, 3, *s), float("nan"), dtype=dt, device=DEV)
             for s, dt in (((H, 32, K), rdt), ((HV, 32, V), rdt), ((HV, 32), f32))]
    return gdnjit.LazyCache(*(p[:, 1] for p in pages), torch.zeros(slots, 4, dtype=i32, device=DEV)), pages


def _pool(g, slots, HV, V, K, sdt, paged=False):
    """A random pool (0.1 scale); ``paged``: the middle part of 3-part pages (slot stride 3 * HV * V * K)."""
    if not paged:
        return (torch.randn(slots, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt), None
    pages = (torch.randn(slots, 3, HV, V, K, device=DEV, generator=g) * 0.1).to(sdt)
    return pages[:, 1], pages


def _poison_next_alloc(shape, dtype):
    """Leave a NaN-filled block of this size in torch's caching allocator, which hands it to the next allocation of
    the same size (an output gdnjit allocates): padding rows must come back zeros, not NaN."""
    x = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    del x


@contextlib.contextmanager
def forcing(tunables: Optional[dict]):
    """Make the dispatcher pick these gdn_lazy tunables for every step and fold inside (None: the rules' choice;
    tools/bench_lazy.py --force uses it too). The others stay the rules' choice, except a staged tile the forced ones
    rule out (a forced rows form, say): then the tile goes a chunk at a time."""
    if not tunables:
        yield
        return
    from gdnjit import runner
    from gdnjit.variant import Variant

    orig = runner.choose_variant

    def forced(spec, params, facts, arch, tuned=None, batch_invariant=False):
        v = orig(spec, params, facts, arch, tuned, batch_invariant)
        if spec.name != "gdn_lazy" or params["mode"] == "reset":
            return v
        if params["mode"] == "prep":  # of a prep launch's tunables only the window and its head warps count
            return Variant.make(spec, params, dict(v.tunables, **{n: t for n, t in tunables.items()
                                                                  if n in ("window", "head_warps")}), arch)
        chosen = dict(dict(v.tunables), **{n: t for n, t in tunables.items() if n != "head_warps"})
        if "window" not in tunables:  # the eager form's window is 0, the others' the rules' 16
            chosen["window"] = 0 if chosen["form"] == "eager" else chosen["window"] or 16
        if "staged" not in tunables and not spec.valid(params, chosen):
            chosen["staged"] = False
        return Variant.make(spec, params, chosen, arch)

    runner.RUNNER.clear()
    runner.choose_variant = forced
    try:
        yield
    finally:
        runner.choose_variant = orig
        runner.RUNNER.clear()


def _window(q, k, v, A_log, a, dtb, b, pool, idx, cache, acc, kw=None, null_block_id=-1) -> int:
    """The window of the variant the dispatcher picks for this step (under any forcing): the model's, which folds as
    that variant does (0: the eager form's)."""
    from gdnjit.lazy import prepare_step
    from gdnjit.runner import RUNNER

    kw = dict(dict(scale=None, use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0), **(kw or {}))
    _, call = prepare_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, acc, kw["scale"], kw["use_qk_l2norm"],
                           kw["softplus_beta"], kw["softplus_threshold"], null_block_id, None)
    return dict(RUNNER.variant(call).tunables)["window"]


def _check_rings(model: LazyModel, cache, slot: int, rows: list, what: str, tol: float) -> None:
    """The ring rows ``rows`` of ``slot``: k and u against the model (rounded alike: within a rounding step of the
    ring dtype, u relative to its largest value), G within fp32 accumulation."""
    if not rows:
        return
    k = cache[0][slot][:, rows].double()
    u = cache[1][slot][:, rows].double()
    gg = cache[2][slot][:, rows].double()
    mk, mu, mg = model.k[slot][:, rows], model.u[slot][:, rows], model.g[slot][:, rows]
    rt = 1e-5 if cache[0].dtype == f32 else 2 ** -7
    assert torch.isfinite(k).all() and torch.isfinite(u).all() and torch.isfinite(gg).all(), f"{what}: NaN ring row"
    assert torch.allclose(k, mk, rtol=rt, atol=1e-6), f"{what}: k ring rows {rows}: {(k - mk).abs().max().item()}"
    assert _rel(u, mu) < tol, f"{what}: u ring rows {rows}: {_rel(u, mu)}"
    assert torch.allclose(gg, mg, rtol=1e-5, atol=2e-4), f"{what}: g ring rows {rows}: {(gg - mg).abs().max().item()}"


def _tols(sdt, rdt, odt):
    """(output, state / u) tolerances: fp32 end to end, a 16-bit output, a 16-bit state or ring."""
    if sdt != f32 or rdt != f32:
        return 2e-2, 2e-2
    return (5e-5 if odt == f32 else 1e-2), 5e-5


# ---- gdnjit's own calls: loops against the model ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    K: int = 128
    V: int = 128
    H: int = 2
    rep: int = 2           # HV / H
    T: int = 4
    in_dt: torch.dtype = bf
    sdt: torch.dtype = f32
    rdt: torch.dtype = f32
    gate_dt: torch.dtype = f32
    spec: bool = False
    null: int = -1
    B: int = 5             # rows (padding included)
    idx_dt: torch.dtype = i32
    out: str = "alloc"     # alloc | fp32 | same (a given output of q's dtype)
    paged: bool = False    # page-strided pool and rings
    force: Optional[tuple] = None  # ((tunable, value), ...)
    l2norm: bool = True

    def __str__(self):
        s = (f"K{self.K}V{self.V}H{self.H}x{self.rep}T{self.T}-{str(self.in_dt)[6:]}-s{str(self.sdt)[6:]}"
             f"-r{str(self.rdt)[6:]}-{'spec' if self.spec else 'plain'}-null{self.null}-B{self.B}-{self.out}")
        return s + ("-paged" if self.paged else "") + (f"-{dict(self.force)}" if self.force else "") + \
            ("" if self.l2norm else "-nol2")


CASES = [
    Case(T=1, B=37),  # the eager form by the rules (an fp32 state, a small batch; and the tile form, below)
    Case(T=1, B=37, force=(("form", "rows"), ("lanes_per_row", 8), ("rows_per_lane", 2), ("tile_v", 16))),
    Case(rep=4, T=4, sdt=bf, rdt=bf, spec=True, null=0, idx_dt=i64, paged=True),
    Case(K=64, V=64, H=4, rep=1, T=2, in_dt=fp16, sdt=fp16, rdt=fp16, gate_dt=fp16, spec=True, B=3, out="fp32"),
    Case(K=256, V=128, H=1, T=8, rdt=bf, gate_dt=bf, null=0, B=7, out="same", paged=True),
    Case(K=128, V=256, rep=1, T=16, in_dt=fp16, sdt=bf, spec=True, B=4, idx_dt=i64, force=(("tile_v", 64),)),
    Case(K=64, V=256, H=1, rep=4, T=5, spec=True, null=0, B=9, out="fp32", force=(("tile_v", 32), ("window", 8))),
    Case(K=256, V=256, H=1, rep=1, T=3, sdt=fp16, rdt=bf, B=1),
    Case(K=128, V=64, T=12, sdt=bf, rdt=fp16, spec=True, B=6, idx_dt=i64),
    Case(K=64, V=128, rep=4, T=7, in_dt=fp16, rdt=fp16, null=0, B=33, force=(("window", 8),)),
    Case(H=4, T=1, sdt=bf, rdt=bf, spec=True, B=40, out="same", paged=True),
    Case(K=256, V=64, rep=1, T=16, B=3, out="fp32", l2norm=False),
    Case(K=128, V=128, H=1, rep=2, T=10, sdt=fp16, rdt=fp16, in_dt=fp16, spec=True, null=0, B=11,
         force=(("tile_v", 128),)),
    # the rows form's other shapes: 4 and 16 lanes a row, 1..4 rows a lane, 1..8 warps a CTA
    Case(T=1, sdt=bf, rdt=bf, B=37, spec=True, force=(("form", "rows"), ("lanes_per_row", 4), ("rows_per_lane", 1),
                                                      ("tile_v", 64))),
    Case(K=256, V=64, rep=4, T=2, sdt=f32, B=9, force=(("form", "rows"), ("lanes_per_row", 16), ("rows_per_lane", 2),
                                                      ("tile_v", 32))),
    Case(K=64, V=256, T=4, sdt=bf, rdt=f32, B=6, spec=True, force=(("form", "rows"), ("lanes_per_row", 8),
                                                                   ("rows_per_lane", 2), ("tile_v", 64), ("window", 8))),
    # fp32 rings in CTAs of 16 rows: the fold's update on tensor cores (tc_fold) inside a step, with 4 warps of 64
    # columns (K 256), 2 of 32 (K 64) and, a bf16 state's, 1 of 128; speculative steps with pending rows
    Case(K=256, V=128, H=2, rep=2, T=1, B=9, null=0, force=(("form", "rows"), ("lanes_per_row", 16),
                                                             ("rows_per_lane", 2), ("tile_v", 16))),
    Case(K=64, V=128, rep=3, T=3, spec=True, B=7, idx_dt=i64, force=(("form", "rows"), ("lanes_per_row", 8),
                                                                      ("rows_per_lane", 2), ("tile_v", 16))),
    Case(T=1, sdt=bf, rdt=f32, B=37, null=0, force=(("form", "rows"), ("lanes_per_row", 8), ("rows_per_lane", 4),
                                                     ("tile_v", 16))),
    Case(K=64, V=64, rep=2, T=2, in_dt=fp16, sdt=fp16, rdt=f32, spec=True, B=6),  # (its folds the rules' rows)
    # an fp32 state's plain steps with fp32 rings past B * HV 528 (K 128): the rules' rows of 16 lanes x 4 rows (v71)
    Case(H=4, rep=4, T=1, B=37, null=0),
    Case(H=2, rep=8, T=1, B=35, idx_dt=i64, out="fp32", paged=True),
    # an fp32 state's T 2 / 3 speculative steps at B * HV >= 2048: the rules' rows form
    Case(K=64, V=64, H=16, rep=4, T=2, spec=True, B=33, null=0),
    Case(K=128, V=64, H=8, rep=8, T=3, spec=True, B=34, idx_dt=i64, out="fp32"),
    # the prep launch's warps an item: one for all its value heads (the rules' large batches, and T >= 2), or 4
    Case(T=1, sdt=bf, rdt=bf, rep=4, B=5, null=0, force=(("form", "rows"), ("lanes_per_row", 8), ("rows_per_lane", 4),
                                                         ("tile_v", 16), ("head_warps", 1))),
    Case(K=64, V=64, H=2, rep=3, T=1, B=6, force=(("form", "rows"), ("lanes_per_row", 8), ("rows_per_lane", 2),
                                                  ("tile_v", 16), ("head_warps", 1))),
    Case(K=64, V=64, H=2, rep=3, T=1, sdt=bf, rdt=bf, B=6, force=(("form", "rows"), ("lanes_per_row", 8),
                                                                  ("rows_per_lane", 4), ("tile_v", 16))),
    Case(K=64, V=64, H=2, rep=3, T=2, sdt=bf, rdt=bf, B=4, force=(("form", "rows"), ("lanes_per_row", 8),
                                                                   ("rows_per_lane", 4), ("tile_v", 16))),
]
# The tile form with a 16-bit state and ring (ring_mma) takes the state a 64-column chunk at a time, or (staged, the
# rules' smallest batches) whole: both, with K 128 and 256 (the fold reads the chunks it no longer holds again).
CASES += [
    Case(rep=4, T=4, sdt=bf, rdt=bf, spec=True, B=6, force=(("staged", False),)),
    Case(T=1, sdt=bf, rdt=bf, B=37, force=(("staged", False),)),
    Case(K=256, V=128, H=1, rep=2, T=3, sdt=bf, rdt=bf, spec=True, B=5, null=0,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 64), ("staged", False))),
    Case(K=256, V=64, H=2, rep=2, T=6, in_dt=fp16, sdt=fp16, rdt=fp16, spec=True, B=4, paged=True,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 64), ("staged", True))),
    Case(K=128, V=128, H=1, rep=4, T=8, sdt=bf, rdt=bf, spec=True, B=3, idx_dt=i64,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 128), ("staged", True))),
    # a chunk at a time past T = 4 (late_keys: the window's keys by cp.async after chunk 0's dots), K 128 / 256 / 64
    Case(K=128, V=128, H=1, rep=4, T=8, sdt=bf, rdt=bf, spec=True, B=3, null=0,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 128), ("staged", False))),
    Case(K=256, V=128, H=2, rep=2, T=5, in_dt=fp16, sdt=fp16, rdt=fp16, spec=True, B=4, paged=True,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 64), ("staged", False))),
    Case(K=64, V=64, H=2, rep=1, T=6, sdt=bf, rdt=bf, B=5, idx_dt=i64,
         force=(("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1), ("tile_v", 32), ("staged", False))),
]
TILE_FORM = (("form", "tile"), ("lanes_per_row", 8), ("rows_per_lane", 1))


def _forms(case: Case) -> tuple:
    """The case as given (the rules' form, or its forced one) and, unless it forces a form, in the tile form."""
    if any(n == "form" for n, _ in case.force or ()):
        return (case,)
    tile = dict(TILE_FORM, tile_v=dict(case.force or ()).get("tile_v", 32), **{
        n: v for n, v in case.force or () if n == "window"})
    return case, dataclasses.replace(case, force=tuple(tile.items()))


@pytest.mark.parametrize("case", [f for c in CASES for f in _forms(c)], ids=str)
def test_loop_matches_the_model(case: Case):
    """Six steps over a pool with gaps (requests joining and leaving: each step a random subset of the users, in a
    random order, with padding rows), explicit folds (with accepted counts) and resets (a fresh checkpoint) between
    them; after every call: outputs, checkpoints, live ring rows and cursors against the model."""
    c = case
    H, HV, K, V, T, B = c.H, c.H * c.rep, c.K, c.V, c.T, c.B
    seed = zlib.crc32(str(c).encode())
    g = torch.Generator(device=DEV).manual_seed(seed)
    rng = random.Random(seed)
    slots = 2 * B + 4
    pool, pool_pages = _pool(g, slots, HV, V, K, c.sdt, c.paged)
    cache, ring_pages = _poisoned_cache(slots, H, HV, K, V, c.rdt, c.paged)
    A_log, dtb = _gate_params(g, HV, c.gate_dt)
    window = dict(c.force or ()).get("window", 16)
    model = LazyModel.from_cache(pool, cache, window=window)
    kw = dict(scale=None if c.l2norm else 0.05, use_qk_l2norm=c.l2norm,
              softplus_beta=1.0 if c.l2norm else 2.0, softplus_threshold=20.0 if c.l2norm else 1.5)
    tol_out, tol_state = _tols(c.sdt, c.rdt, {"alloc": c.in_dt, "fp32": f32, "same": c.in_dt}[c.out])
    first_user = max(c.null + 1, 0) + 1  # slot 0 (and the null block) stay out of use
    users = list(range(first_user, slots - 2))  # the last two slots: a gap no request uses
    n_pad = 0 if B == 1 else (2 if B >= 5 else 1)
    pad_values = [-1, c.null if c.null >= 0 else -1][:n_pad]
    other_parts = None if pool_pages is None else pool_pages[:, [0, 2]].clone()
    what = str(c)
    with forcing(dict(c.force) if c.force else None):
        for step in range(6):
            rows = rng.sample(users, B - n_pad)
            pads = sorted(rng.sample(range(B), n_pad))
            idx_list = list(rows)
            for p_, val in zip(pads, pad_values):
                idx_list.insert(p_, val)
            idx = torch.tensor(idx_list, dtype=c.idx_dt, device=DEV)
            q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, c.in_dt)
            if not c.l2norm:  # unit-size keys without the l2norm: the delta rule stays contractive
                k = (k.float() * K ** -0.5).to(c.in_dt)
            acc = torch.tensor([rng.randint(-1, T + 1) for _ in range(B)], dtype=i32, device=DEV) if c.spec else None
            model.window = _window(q, k, v, A_log, a, dtb, b, pool, idx, cache, acc, kw, c.null)
            ref = model.step(q, k, v, A_log, a, dtb, b, idx, acc, null_block_id=c.null, **kw)
            before = pool.clone()
            if c.out == "alloc":
                output = None
                _poison_next_alloc((B, T, HV, V), c.in_dt)
            else:
                output = torch.full((B, T, HV, V), float("nan"), dtype=f32 if c.out == "fp32" else c.in_dt,
                                    device=DEV)
            out = gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc,
                                                    null_block_id=c.null, output=output, **kw)
            torch.cuda.synchronize()
            w = f"{what} step {step}"
            _check_step(model, pool, before, cache, out, ref, output, idx_list, pads, c.null, tol_out, tol_state, w)
            if step % 3 == 1:  # an explicit fold of some slots, with the last step's accepted counts
                fidx_list = rng.sample(users, 3) + [-1]
                fidx = torch.tensor(fidx_list, dtype=c.idx_dt, device=DEV)
                facc = torch.tensor([rng.randint(0, T) for _ in range(4)], dtype=i32, device=DEV) if c.spec else None
                model.fold(fidx, facc)
                before = pool.clone()
                gdnjit.gated_delta_rule_lazy_fold(pool, fidx, cache, num_accepted=facc)
                torch.cuda.synchronize()
                _check_pool(model, pool, before, fidx_list[:3], tol_state, f"{w} fold")
                assert torch.equal(cache.cursor.cpu(), model.cursor), f"{w} fold: cursors"
            elif step % 3 == 2:  # a prefill wrote fresh checkpoints into some slots: reset their rings
                ridx_list = rng.sample(users, 2) + ([c.null] if c.null >= 0 else [-1])
                for s in ridx_list[:2]:
                    pool[s] = (torch.randn(HV, V, K, device=DEV, generator=g) * 0.1).to(c.sdt)
                    model.state[s] = pool[s].double()
                ridx = torch.tensor(ridx_list, dtype=c.idx_dt, device=DEV)
                model.reset(ridx, null_block_id=c.null)
                gdnjit.gated_delta_rule_lazy_reset(ridx, cache, null_block_id=c.null)
                torch.cuda.synchronize()
                assert torch.equal(cache.cursor.cpu(), model.cursor), f"{w} reset: cursors"
    # slots no request used (slot 0, the null block, the gap): never touched
    for s in [s for s in range(slots) if s not in users]:
        assert int(cache.cursor[s].abs().sum()) == 0, f"{what}: unused slot {s}'s cursor"
        assert torch.isnan(cache.g[s]).all() and torch.isnan(cache.u[s].float()).all(), f"{what}: slot {s}'s ring"
    if other_parts is not None:
        assert torch.equal(pool_pages[:, [0, 2]], other_parts), f"{what}: the pages' other parts were written"
        assert all(torch.isnan(p[:, [0, 2]].float()).all() for p in ring_pages), f"{what}: ring pages' other parts"


def _check_step(model, pool, before, cache, out, ref, output, idx_list, pads, null, tol_out, tol_state, w):
    """After a step: the live rows' outputs, the padding rows' (zeros in an allocated output, untouched in a given
    one), the checkpoints, the cursors and the live ring rows, against the model."""
    live = [s for s in idx_list if s > null and s >= 0]
    live_rows = [n for n, s in enumerate(idx_list) if s > null and s >= 0]
    err = _rel(out[live_rows].float(), ref[live_rows])
    assert err < tol_out, f"{w}: outputs {err}"
    if pads:
        if output is None:
            assert (out[pads] == 0).all(), f"{w}: an allocated output's padding rows are zeros"
        else:
            assert torch.isnan(out[pads].float()).all(), f"{w}: a given output's padding rows are untouched"
    _check_pool(model, pool, before, live, tol_state, w)
    assert torch.equal(cache.cursor.cpu(), model.cursor), f"{w}: cursors\n{cache.cursor}\n{model.cursor}"
    for s in live:
        _check_rings(model, cache, s, model.live_rows(s), f"{w} slot {s}", tol_state)


def _check_pool(model, pool, before, live, tol, what):
    """Live slots against the model's checkpoints; every other slot bit-exact as before."""
    live = sorted(set(s for s in live if s >= 0))
    others = [s for s in range(pool.shape[0]) if s not in live]
    if live:
        err = _rel(pool[live], model.state[live])
        assert err < tol, f"{what}: checkpoints {err}"
    assert torch.equal(pool[others], before[others]), f"{what}: a slot no row names was written"


ROWS_F32 = dict(form="rows", lanes_per_row=8, rows_per_lane=2, tile_v=16)  # the rules' fp32 rows (tc_fold)
ROWS_F32_16 = dict(form="rows", lanes_per_row=16, rows_per_lane=4, tile_v=16)  # the rules' fp32 plain steps, K 128
LAZY_TILE = dict(form="tile", lanes_per_row=8, rows_per_lane=1, tile_v=128)  # the rules' small plain batches but fp32's
ROWS_16 = dict(form="rows", lanes_per_row=8, rows_per_lane=4, tile_v=16)   # a 16-bit state's (with fp32 rings: tc_fold)


@pytest.mark.parametrize("T,spec,sdt,rdt,force", [(1, False, f32, f32, None), (5, True, bf, bf, None),
                                                  (12, False, fp16, fp16, None), (16, True, f32, f32, None),
                                                  (1, False, f32, f32, ROWS_F32), (4, True, f32, f32, ROWS_F32),
                                                  (1, False, f32, f32, ROWS_F32_16),
                                                  (3, True, bf, f32, ROWS_16), (2, True, bf, bf, ROWS_16)])
def test_fold_at_every_window_length(T, spec, sdt, rdt, force):
    """17 slots holding P = 0..16 committed rows (built by 16 plain T = 1 steps over shrinking sets of rows); a step
    of T tokens on all of them folds exactly where P + T > 16 (outputs, checkpoints, rings, cursors against the
    model); then an explicit fold (accepted counts 0..T of the pending rows in speculative mode) leaves every slot's
    exact state in its checkpoint: folds at every P. The rules give these 17 rows' steps the tile form (an fp32
    state's plain steps the eager form, which keeps no window: the tile form forced); forced, the rows form folds
    inside the step too (with fp32 rings tc_fold, a bf16 state and rings mma_fold)."""
    H, HV, K, V = 2, 4, 128, 128
    g = torch.Generator(device=DEV).manual_seed(T)
    pool, _ = _pool(g, 17, HV, V, K, sdt)
    cache, _ = _poisoned_cache(17, H, HV, K, V, rdt)
    A_log, dtb = _gate_params(g, HV)
    model = LazyModel.from_cache(pool, cache)
    tol_out, tol_state = _tols(sdt, rdt, bf)
    with forcing(LAZY_TILE if sdt == f32 else None):  # (the rules' eager form of an fp32 state keeps no window)
        for i in range(16):
            idx = torch.tensor([s if s > i else -1 for s in range(17)], dtype=i32, device=DEV)
            toks = _tokens(g, 17, 1, H, HV, K, V, bf)
            model.step(*toks[:3], A_log, toks[3], dtb, toks[4], idx)
            gdnjit.gated_delta_rule_lazy_step(*toks[:3], A_log, toks[3], dtb, toks[4], pool, idx, cache)
    torch.cuda.synchronize()
    assert cache.cursor[:, 0].tolist() == list(range(17)) and torch.equal(cache.cursor.cpu(), model.cursor)
    assert torch.isnan(cache.g[:, :, 16:]).all(), "rows past 16 were written"
    idx = torch.randperm(17, device=DEV, generator=g).to(i32)
    toks = _tokens(g, 17, T, H, HV, K, V, bf)
    acc = torch.zeros(17, dtype=i32, device=DEV) if spec else None
    force = force or (LAZY_TILE if sdt == f32 and T == 1 else None)
    ref = model.step(*toks[:3], A_log, toks[3], dtb, toks[4], idx, acc)
    before = pool.clone()
    with forcing(force):
        out = gdnjit.gated_delta_rule_lazy_step(*toks[:3], A_log, toks[3], dtb, toks[4], pool, idx, cache,
                                                num_accepted=acc)
    torch.cuda.synchronize()
    assert _rel(out.float(), ref) < tol_out
    _check_pool(model, pool, before, list(range(17)), tol_state, f"T={T} step")
    assert torch.equal(cache.cursor.cpu(), model.cursor)
    folded = [s for s in range(17) if s + T > 16 and s > 0]
    assert [s for s in range(17) if not torch.equal(pool[s], before[s])] == folded
    for s in range(17):
        _check_rings(model, cache, s, model.live_rows(s), f"T={T} slot {s}", tol_state)
    facc = torch.randint(0, T + 1, (17,), device=DEV, generator=g, dtype=i32) if spec else None
    exact = None
    if not spec:  # the exact current state (no rounding) before the fold
        exact = model.current_state()
    model.fold(idx, None if facc is None else facc)
    before = pool.clone()
    gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache, num_accepted=facc)
    torch.cuda.synchronize()
    _check_pool(model, pool, before, list(range(17)), tol_state, f"T={T} fold")
    assert cache.cursor[:, 0].abs().sum() == 0 and cache.cursor[:, 2].abs().sum() == 0
    assert torch.equal(cache.cursor.cpu(), model.cursor)
    if exact is not None:
        assert _rel(pool.double(), exact) < (1e-5 if sdt == f32 else 1e-2)


def test_fold_and_reset_of_padding_and_null_blocks():
    """A fold and a reset whose rows are all padding (negative, null blocks 0..2) change nothing; an empty fold
    (P = 0) leaves the checkpoint's bits."""
    H, HV, K, V, slots = 1, 2, 64, 64, 6
    g = torch.Generator(device=DEV).manual_seed(3)
    pool, _ = _pool(g, slots, HV, V, K, bf)
    cache, _ = _poisoned_cache(slots, H, HV, K, V, bf)
    A_log, dtb = _gate_params(g, HV)
    idx = torch.tensor([0, 1, 2, 3, 4, 5], dtype=i32, device=DEV)
    toks = _tokens(g, slots, 3, H, HV, K, V, bf)
    gdnjit.gated_delta_rule_lazy_step(*toks[:3], A_log, toks[3], dtb, toks[4], pool, idx, cache)
    pool_before, cur_before = pool.clone(), cache.cursor.clone()
    pad = torch.tensor([-1, 2, 0, 1, -5], dtype=i64, device=DEV)
    gdnjit.gated_delta_rule_lazy_fold(pool, pad, cache, null_block_id=2)
    gdnjit.gated_delta_rule_lazy_reset(pad, cache, null_block_id=2)
    torch.cuda.synchronize()
    assert torch.equal(pool, pool_before) and torch.equal(cache.cursor, cur_before)
    gdnjit.gated_delta_rule_lazy_reset(torch.tensor([4], dtype=i32, device=DEV), cache)
    gdnjit.gated_delta_rule_lazy_fold(pool, torch.tensor([4], dtype=i32, device=DEV), cache)  # P = 0
    torch.cuda.synchronize()
    assert torch.equal(pool, pool_before) and cache.cursor[4].tolist() == [0, 0, 0, 0]


# ---- the eager form (window 0: plain decoding that folds every step) -------------------------------------------


EAGER = dict(form="eager", window=0)


@pytest.mark.parametrize("K,V,H,rep,sdt,rdt,in_dt,lanes,rpl,tile_v,null,B,out,idx_dt,l2norm,gate_dt", [
    (128, 128, 2, 2, f32, f32, bf, 8, 2, 32, -1, 5, "alloc", i32, True, f32),
    (128, 128, 2, 4, bf, bf, bf, 4, 2, 32, 0, 9, "same", i64, True, bf),
    (128, 128, 1, 2, bf, f32, fp16, 8, 4, 32, -1, 3, "fp32", i32, True, f32),
    (64, 256, 2, 3, fp16, fp16, fp16, 8, 1, 32, 0, 7, "alloc", i32, True, fp16),
    (256, 64, 1, 1, f32, bf, bf, 16, 2, 32, -1, 4, "alloc", i64, False, bf),
    (256, 128, 2, 2, bf, bf, bf, 16, 4, 64, -1, 6, "fp32", i32, True, f32),
    (64, 64, 4, 1, f32, fp16, bf, 4, 1, 16, 0, 1, "same", i32, True, fp16),
])
def test_eager_steps_match_the_model(K, V, H, rep, sdt, rdt, in_dt, lanes, rpl, tile_v, null, B, out, idx_dt,
                                     l2norm, gate_dt):
    """Eager steps (the eager form forced, window 0) between lazy plain steps (the rules'; an fp32 state's the tile
    form forced: the rules give it the eager form) and speculative steps (the rules'), folds and
    resets, over a pool with gaps and padding rows: an eager step over a slot whose ring holds committed rows (and
    pending ones, dropped) folds them with its token and empties the ring; over an empty ring it writes the state and
    leaves the cursor alone. After every call: outputs, checkpoints (every other slot bit-exact), cursors, and the live
    ring rows of the lazy steps, against the model (window 0 for the eager steps)."""
    HV = H * rep
    seed = zlib.crc32(f"eager{K}{V}{H}{rep}{sdt}{rdt}{lanes}{rpl}{tile_v}{B}".encode())
    g = torch.Generator(device=DEV).manual_seed(seed)
    rng = random.Random(seed)
    slots = 2 * B + 4
    pool, _ = _pool(g, slots, HV, V, K, sdt)
    cache, _ = _poisoned_cache(slots, H, HV, K, V, rdt)
    A_log, dtb = _gate_params(g, HV, gate_dt)
    model = LazyModel.from_cache(pool, cache)
    kw = dict(scale=None if l2norm else 0.05, use_qk_l2norm=l2norm, softplus_beta=1.0 if l2norm else 2.0,
              softplus_threshold=20.0 if l2norm else 1.5)
    tol_out, tol_state = _tols(sdt, rdt, {"alloc": in_dt, "fp32": f32, "same": in_dt}[out])
    first_user = max(null + 1, 0) + 1
    users = list(range(first_user, slots - 2))
    n_pad = 0 if B == 1 else (2 if B >= 5 else 1)
    pad_values = [-1, null if null >= 0 else -1][:n_pad]
    force = dict(EAGER, lanes_per_row=lanes, rows_per_lane=rpl, tile_v=tile_v)
    # lazy steps fill the rings (plain, speculative with pending rows), eager ones empty them, again and again;
    # "eager=": on the previous step's slots (in a new order), so that each kind of ring meets an eager step
    plan = ["lazy", "eager=", "eager", "spec", "eager=", "lazy", "spec", "eager=", "lazy", "lazy", "eager=", "eager"]
    eager_over = set()
    rows = []
    for step, kind in enumerate(plan):
        rows = rng.sample(rows, len(rows)) if kind == "eager=" else rng.sample(users, B - n_pad)
        kind = kind.rstrip("=")
        pads = sorted(rng.sample(range(B), n_pad))
        idx_list = list(rows)
        for p_, val in zip(pads, pad_values):
            idx_list.insert(p_, val)
        idx = torch.tensor(idx_list, dtype=idx_dt, device=DEV)
        live = [s for s in idx_list if s > null and s >= 0]
        T = 3 if kind == "spec" else 1
        q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, in_dt)
        if not l2norm:
            k = (k.float() * K ** -0.5).to(in_dt)
        acc = torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=i32, device=DEV) if kind == "spec" else None
        if kind == "eager":
            eager_over |= {(int(model.cursor[s, 0]) > 0, int(model.cursor[s, 2]) > 0) for s in live}
        model.window = 0 if kind == "eager" else 16
        ref = model.step(q, k, v, A_log, a, dtb, b, idx, acc, null_block_id=null, **kw)
        before = pool.clone()
        if out == "alloc":
            output = None
            _poison_next_alloc((B, T, HV, V), in_dt)
        else:
            output = torch.full((B, T, HV, V), float("nan"), dtype=f32 if out == "fp32" else in_dt, device=DEV)
        lazy = dict(LAZY_TILE, tile_v=min(V, 128)) if kind == "lazy" and sdt == f32 else None
        with forcing(force if kind == "eager" else lazy):
            res = gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc,
                                                    null_block_id=null, output=output, **kw)
        torch.cuda.synchronize()
        _check_step(model, pool, before, cache, res, ref, output, idx_list, pads, null, tol_out, tol_state,
                    f"step {step} ({kind})")
        if step == 6:  # an explicit fold and a reset between them
            fidx = torch.tensor(rng.sample(users, 2) + [-1], dtype=idx_dt, device=DEV)
            model.fold(fidx)
            gdnjit.gated_delta_rule_lazy_fold(pool, fidx, cache)
            ridx = torch.tensor(rng.sample(users, 2), dtype=idx_dt, device=DEV)
            model.reset(ridx)
            gdnjit.gated_delta_rule_lazy_reset(ridx, cache)
            torch.cuda.synchronize()
            assert torch.equal(cache.cursor.cpu(), model.cursor), "fold / reset: cursors"
    assert (False, False) in eager_over and (True, False) in eager_over, eager_over
    assert (False, True) in eager_over or (True, True) in eager_over, eager_over  # pending rows dropped


def test_eager_errors():
    """The eager form takes plain steps of one token: forced onto a speculative step (or T > 1) the dispatcher
    refuses it, naming the constraint."""
    g = torch.Generator(device=DEV).manual_seed(3)
    H, HV, K, V, B = 1, 2, 64, 64, 2
    pool, _ = _pool(g, 4, HV, V, K, f32)
    cache = gdnjit.lazy_cache(4, H, HV, K, V, dtype=f32, device=DEV)
    A_log, dtb = _gate_params(g, HV)
    idx = torch.tensor([0, 2], dtype=i32, device=DEV)
    for T, acc in ((1, torch.zeros(B, dtype=i32, device=DEV)), (2, None)):
        q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
        with forcing(dict(EAGER, lanes_per_row=8, rows_per_lane=1, tile_v=32)):
            with pytest.raises(ValueError, match="eager form is plain decoding"):
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc)


# ---- CUDA graphs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sdt", [bf, f32])
def test_captured_loop_matches_eager(sdt):
    """A CUDA graph of a short loop over two layers (plain T = 1 steps and speculative T = 4 steps in turn, a fold with
    accepted counts), replayed with new inputs copied in, gives the bits of the same loop run eagerly on copies. (An
    fp32 state's plain steps take the eager form here, the second over rings the speculative step filled.)"""
    L, H, HV, K, V, B, slots = 2, 2, 8, 128, 128, 9, 14
    g = torch.Generator(device=DEV).manual_seed(9)
    pools = [_pool(g, slots, HV, V, K, sdt)[0] for _ in range(L)]
    cache = gdnjit.lazy_cache(slots, H, HV, K, V, dtype=sdt, device=DEV, layers=L)
    A_log, dtb = _gate_params(g, HV)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(i32)
    idx[4] = -1
    plan = [(1, False), (4, True), (1, False), (4, True)]
    inputs = [[torch.zeros_like(x) for x in _tokens(g, B, T, H, HV, K, V, bf)] for T, _ in plan]
    accs = [torch.zeros(B, dtype=i32, device=DEV) for _ in range(len(plan) + 1)]
    outs = [[torch.zeros(B, T, HV, V, dtype=bf, device=DEV) for _ in range(L)] for T, _ in plan]

    def loop(pools, cache):
        for s, (T, spec) in enumerate(plan):
            for layer in range(L):
                q, k, v, a, b = inputs[s]
                gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pools[layer], idx, cache.layer(layer),
                                                  num_accepted=accs[s] if spec else None, output=outs[s][layer])
        for layer in range(L):
            gdnjit.gated_delta_rule_lazy_fold(pools[layer], idx, cache.layer(layer), num_accepted=accs[-1])

    def fill(seed):
        gg = torch.Generator(device=DEV).manual_seed(seed)
        for s, (T, _) in enumerate(plan):
            for dst, src in zip(inputs[s], _tokens(gg, B, T, H, HV, K, V, bf)):
                dst.copy_(src)
        for a_ in accs:
            a_.copy_(torch.randint(0, 5, (B,), device=DEV, generator=gg, dtype=i32))

    fill(1)
    for _ in range(3):  # compile and load outside the capture; the bases slide around the rings
        loop(pools, cache)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loop(pools, cache)
    for seed in (2, 3, 4):
        fill(seed)
        pools_e = [p.clone() for p in pools]
        cache_e = gdnjit.LazyCache(*(x.clone() for x in cache))
        loop(pools_e, cache_e)
        eager = [[o.clone() for o in step] for step in outs]
        graph.replay()
        torch.cuda.synchronize()
        for s in range(len(plan)):
            for layer in range(L):
                assert torch.equal(outs[s][layer], eager[s][layer]), f"seed {seed} step {s} layer {layer}"
        for layer in range(L):
            assert torch.equal(pools[layer], pools_e[layer]), f"seed {seed} layer {layer}: pool"
        for x, y in zip(cache, cache_e):
            assert torch.equal(x, y), f"seed {seed}: cache"
        assert int(cache.cursor[:, :, 3].abs().sum()) == 0, "arrival counts are back to 0"


# ---- long runs against sequential decoding ---------------------------------------------------------------------


def _plain_run(sdt, rdt, seed: int, N: int = 1000, plain: bool = True) -> dict:
    """N plain T = 1 lazy steps of 3 requests, a final fold; the drifts (max abs error / max abs reference) of the
    outputs (fp32) and the final state from float64 sequential decoding of the stream; ``plain``: also those of a
    plain decode (gated_delta_rule_decode_pretranspose) over a pool of the same dtype."""
    H, HV, K, V, B, slots = 2, 8, 128, 128, 3, 6
    g = torch.Generator(device=DEV).manual_seed(seed)
    pool0 = (torch.randn(slots, HV, V, K, device=DEV, generator=g)).to(sdt)  # state entries ~1
    A_log, dtb = _gate_params(g, HV)
    idx = torch.tensor([4, 1, 3], dtype=i32, device=DEV)
    il = idx.long()
    toks = [x.unsqueeze(2) for x in _tokens(g, N, B, H, HV, K, V, bf)]  # [N, B, 1, ...]: step t's inputs contiguous
    cache = gdnjit.lazy_cache(slots, H, HV, K, V, dtype=rdt, device=DEV)
    pool = pool0.clone()
    out = torch.empty(N, B, 1, HV, V, device=DEV)
    for t in range(N):
        q, k, v, a, b = (x[t] for x in toks)
        gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, output=out[t])
    gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache)
    seq = [x[:, :, 0].transpose(0, 1) for x in toks]  # [B, N, ...]
    ref_out, ref_state = sequential_decode(seq[0], seq[1], seq[2], A_log, seq[3], dtb, seq[4], pool0[il])
    res = dict(lazy_out=_rel(out[:, :, 0].transpose(0, 1), ref_out), lazy_state=_rel(pool[il], ref_state))
    if plain:
        plain_pool = pool0.clone()
        plain_out = torch.empty_like(out)
        for t in range(N):
            q, k, v, a, b = (x[t] for x in toks)
            gdnjit.gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dtb, b, output=plain_out[t],
                                                         initial_state=plain_pool, initial_state_indices=idx)
        res.update(plain_out=_rel(plain_out[:, :, 0].transpose(0, 1), ref_out),
                   plain_state=_rel(plain_pool[il], ref_state))
    return res


def _spec_run(sdt, rdt, seed: int, steps: int = 200, T: int = 4, plain: bool = True) -> dict:
    """``steps`` speculative lazy steps of T drafts with random accept counts 0..T (3 requests), a final fold with the
    last counts: the drift of every step's T outputs (fp32; accepted or not) from float64 decoding from the exact
    state, and of the final state from float64 decoding of the accepted stream; ``plain``: also those of a plain
    decode of the accepted tokens, one at a time (gated_delta_rule_decode_pretranspose), over a pool of that dtype."""
    H, HV, K, V, B, slots = 2, 8, 128, 128, 3, 5
    g = torch.Generator(device=DEV).manual_seed(seed)
    rng = random.Random(seed)
    pool0 = (torch.randn(slots, HV, V, K, device=DEV, generator=g)).to(sdt)
    A_log, dtb = _gate_params(g, HV)
    idx = torch.tensor([2, 0, 4], dtype=i32, device=DEV)
    il = idx.long()
    cache = gdnjit.lazy_cache(slots, H, HV, K, V, dtype=rdt, device=DEV)
    pool, plain_pool = pool0.clone(), pool0.clone()
    exact = pool0[il].double()
    inter = torch.empty(B, T, HV, V, K, dtype=torch.float64, device=DEV)
    acc = torch.zeros(B, dtype=i32, device=DEV)
    out = torch.empty(B, T, HV, V, device=DEV)
    plain_out = torch.empty(B, 1, HV, V, device=DEV)
    err = ref_max = p_err = p_ref_max = 0.0
    for _ in range(steps):
        q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
        gdnjit.gated_delta_rule_lazy_step(q, k, v, A_log, a, dtb, b, pool, idx, cache, num_accepted=acc, output=out)
        r = gdn_reference(q, k, v, A_log, a, dtb, b, exact, intermediate=inter, disable_state_update=True)
        err = max(err, (out.double() - r.output).abs().max().item())
        ref_max = max(ref_max, r.output.abs().max().item())
        acc = torch.tensor([rng.randint(0, T) for _ in range(B)], dtype=i32, device=DEV)
        for n in range(B):
            if int(acc[n]):
                exact[n] = r.intermediate[n, int(acc[n]) - 1]
        for t in range(T if plain else 0):  # plain decoding of the accepted tokens, one at a time per request
            rows = (acc > t).nonzero().flatten()
            if rows.numel() == 0:
                break
            sl = lambda x: x[rows, t:t + 1].contiguous()  # noqa: E731
            o = plain_out[:rows.numel()]
            gdnjit.gated_delta_rule_decode_pretranspose(sl(q), sl(k), sl(v), None, A_log, sl(a), dtb, sl(b), output=o,
                                                         initial_state=plain_pool, initial_state_indices=idx[rows])
            p_err = max(p_err, (o[:, 0].double() - r.output[rows, t]).abs().max().item())
            p_ref_max = max(p_ref_max, r.output[rows, t].abs().max().item())
    gdnjit.gated_delta_rule_lazy_fold(pool, idx, cache, num_accepted=acc)
    torch.cuda.synchronize()
    res = dict(lazy_out=err / ref_max, lazy_state=_rel(pool[il], exact))
    if plain:
        res.update(plain_out=p_err / p_ref_max, plain_state=_rel(plain_pool[il], exact))
    return res


def _report(what, sdt, rdt, res) -> str:
    line = (f"\n{what}, {str(sdt)[6:]} state, {str(rdt)[6:]} rings: lazy output drift {res['lazy_out']:.3g}, "
            f"state drift {res['lazy_state']:.3g}")
    if "plain_out" in res:
        line += f"; plain decode: output drift {res['plain_out']:.3g}, state drift {res['plain_state']:.3g}"
    print(line)
    return line


@pytest.mark.parametrize("kind", ["plain", "plain-rows", "spec"])
@pytest.mark.parametrize("sdt,rdt", [(f32, f32), (bf, bf), (bf, f32)])
def test_long_run_against_sequential_decoding(kind, sdt, rdt):
    """Long runs against float64 sequential decoding (the ground truth): 1000 plain T = 1 steps (a fold every 16
    tokens; the rules give these 3 requests the tile form, an fp32 state's the eager form (a fold every token; its
    lazy tile form below), `plain-rows` forces the rows form of large batches), or
    200 speculative steps of T = 4 drafts with random accept counts 0..4; then a final fold. The drifts
    (max abs error / max abs reference) are printed, with a plain decode's over a pool of the same dtype
    (gated_delta_rule_decode_pretranspose; of the accepted tokens in the speculative run). fp32 state and rings:
    outputs and final state within 1e-5. bf16 state: the outputs drift less than the plain bf16 decode's (the state
    is rounded once per fold instead of once per token); with fp32 rings the final state too (with bf16 rings the
    rounding of every ring row's u and k costs about as much as the plain decode's per-token rounding of the state:
    printed, bounded, not ordered)."""
    rows = dict(form="rows", lanes_per_row=8, rows_per_lane=2 if sdt == f32 else 4, tile_v=16)
    with forcing(rows if kind == "plain-rows" else None):
        run = _spec_run if kind == "spec" else _plain_run
        res = run(sdt, rdt, 23 if kind == "spec" else 11, plain=sdt != f32)
    line = _report(f"lazy {kind} run", sdt, rdt, res)
    if sdt == f32:
        assert res["lazy_out"] < 1e-5 and res["lazy_state"] < 1e-5, line
        return
    assert res["lazy_out"] < res["plain_out"], line
    assert res["lazy_state"] < (res["plain_state"] if rdt == f32 else 2e-2), line


def test_long_run_fp32_lazy_tile():
    """The plain long run above with an fp32 state and rings in the lazy tile form (the rules give these 3 requests
    the eager form, which folds every token): the same bound, 1e-5."""
    with forcing(LAZY_TILE):
        res = _plain_run(f32, f32, 11, plain=False)
    line = _report("lazy plain run, the tile form", f32, f32, res)
    assert res["lazy_out"] < 1e-5 and res["lazy_state"] < 1e-5, line


@pytest.mark.parametrize("kind", ["plain", "spec"])
def test_long_run_a_chunk_at_a_time(kind):
    """The long runs above with a bf16 state and rings in the tile form a 64-column chunk at a time (the rules stage
    these 3 requests' tiles whole): the same bounds."""
    with forcing(dict(form="tile", lanes_per_row=8, rows_per_lane=1, tile_v=128, staged=False)):
        run = _spec_run if kind == "spec" else _plain_run
        res = run(bf, bf, 23 if kind == "spec" else 11, plain=True)
    line = _report(f"lazy {kind} run, a chunk at a time", bf, bf, res)
    assert res["lazy_out"] < res["plain_out"], line
    assert res["lazy_state"] < 2e-2, line


def test_bf16_drift_over_several_streams():
    """The speculative long run above with a bf16 state and rings over six streams (seeds 0..5), each against a plain
    bf16 decode of the same accepted tokens: the lazy outputs drift less on every stream; the final state's drift (the
    rounding of every ring row's u and k and of the state at each fold, against the plain decode's rounding of the
    state every token) is printed per stream and must be lower on average."""
    lines, lazy_state, plain_state = [], [], []
    for seed in range(6):
        res = _spec_run(bf, bf, seed, plain=True)
        lines.append(_report(f"lazy spec run, seed {seed}", bf, bf, res))
        assert res["lazy_out"] < res["plain_out"], lines[-1]
        lazy_state.append(res["lazy_state"])
        plain_state.append(res["plain_state"])
    mean_lazy, mean_plain = sum(lazy_state) / 6, sum(plain_state) / 6
    print(f"\nbf16 state and rings, state drift over 6 streams: lazy mean {mean_lazy:.3g} (max {max(lazy_state):.3g}), "
          f"plain decode mean {mean_plain:.3g} (max {max(plain_state):.3g})")
    assert mean_lazy < mean_plain, "\n".join(lines)


# ---- FlashInfer's u-cache drop-ins -------------------------------------------------------------------------------


def _ucache_rings(slots, H, HV, K, V, rows, rdt):
    return (torch.full((slots, H, rows, K), float("nan"), dtype=rdt, device=DEV),
            torch.full((slots, HV, rows, V), float("nan"), dtype=rdt, device=DEV),
            torch.full((slots, HV, rows), float("nan"), dtype=f32, device=DEV))


@pytest.mark.parametrize("K,V,rep,T,sdt,rdt,restart,flush_min", [
    (128, 128, 2, 4, bf, bf, True, None),       # FlashInfer's own configuration
    (128, 128, 1, 8, bf, bf, False, None),
    (64, 256, 4, 1, f32, f32, True, None),
    (256, 64, 2, 13, fp16, bf, False, 2),
    (128, 256, 1, 16, bf, f32, True, None),     # flush_min 1: every row with a window folds
    (64, 64, 2, 5, f32, fp16, True, 9),         # predictive flushing
    (128, 128, 4, 1, bf, bf, False, None),      # T = 1: the rows form, its fold on tensor cores (NaN past the window)
])
def test_ucache_flush_matches_flashinfer_semantics(K, V, rep, T, sdt, rdt, restart, flush_min):
    """Eight steps of gated_delta_rule_mtp_ucache_flush over 32-row rings (NaN-poisoned) with per-row cursors that
    start anywhere in the ring (wrapping), random accept counts and a padding row: outputs, the pool (folded rows'
    checkpoints; the others bit-exact), the window and new ring rows, and the cursors against the model; the
    caller's commit (or restart_hist_on_flush's) keeps hist_len + T within the ring."""
    H = 2 if rep < 4 else 1
    HV, B = H * rep, 6
    g = torch.Generator(device=DEV).manual_seed(K + V + T)
    rng = random.Random(T)
    slots = B + 3
    pool, _ = _pool(g, slots, HV, V, K, sdt)
    kc, uc, gc = _ucache_rings(slots, H, HV, K, V, 32, rdt)
    model = LazyModel.from_cache(pool, (kc, uc, gc, None))
    A_log, dtb = _gate_params(g, HV)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(i32)
    idx[3] = -1
    hist = torch.zeros(B, dtype=i32, device=DEV)
    base = torch.randint(0, 32, (B,), device=DEV, generator=g, dtype=i32)
    fm = 16 - T + 1 if flush_min is None else flush_min
    tol_out, tol_state = _tols(sdt, rdt, bf)
    live = [int(s) for s in idx.tolist() if s >= 0]
    folds = 0
    for step in range(8 if T > 2 else 24):
        q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
        h0, b0 = hist.clone(), base.clone()
        ref = model.ucache_step(q, k, v, A_log, a, dtb, b, idx, h0, b0, flush_min=fm)
        before = pool.clone()
        _poison_next_alloc((B, T, HV, V), bf)
        out = gdnjit.gated_delta_rule_mtp_ucache_flush(
            A_log, a, dtb, 1.0, 20.0, q=q, k=k, v=v, b=b, initial_state_source=pool, initial_state_indices=idx,
            k_cache=kc, u_cache=uc, g_cache=gc, hist_len=hist, cache_base=base, flush_min=flush_min,
            restart_hist_on_flush=restart)
        torch.cuda.synchronize()
        w = f"step {step}"
        assert _rel(out[[0, 1, 2, 4, 5]].float(), ref[[0, 1, 2, 4, 5]]) < tol_out, w
        assert (out[3] == 0).all(), f"{w}: an allocated output's padding row"
        folded = [int(idx[n]) for n in range(B) if idx[n] >= 0 and int(h0[n]) >= fm]
        folds += len(folded)
        _check_pool(model, pool, before, folded, tol_state, w)
        for n, s in enumerate(idx.tolist()):
            if s >= 0:
                rows = model.rows(s, 0, int(h0[n]) + T, int(b0[n]))  # the window and the T new rows
                _check_rings(model, (kc, uc, gc), s, rows, f"{w} slot {s}", tol_state)
        # mostly accepting (the windows fill up and fold), sometimes anything 0..T
        acc = torch.tensor([rng.randint(0, T) if rng.random() < 0.3 else rng.randint(max(1, T - 2), T)
                            for _ in range(B)], dtype=i32, device=DEV)
        if restart:
            eh, eb = ucache_commit(h0, b0, fm)
            assert torch.equal(hist, eh) and torch.equal(base, eb), f"{w}: restart_hist_on_flush's commit"
            hist += acc
        else:
            assert torch.equal(hist, h0) and torch.equal(base, b0), f"{w}: the cursors are the caller's"
            f_ = h0 >= fm
            base.copy_(torch.where(f_, (b0 + h0) & 31, b0))
            hist.copy_(torch.where(f_, acc, h0 + acc))
        assert int(hist.max()) <= 16
    assert folds >= 2, folds
    assert live


def test_folds_and_flashinfers_flush_a_chunk_at_a_time():
    """The fold-at-every-window-length and FlashInfer-flush tests above (16-bit state and rings) with the tile a
    64-column chunk at a time, as the rules give large batches (their small ones stage the tile whole)."""
    with forcing(dict(form="tile", lanes_per_row=8, rows_per_lane=1, tile_v=128, staged=False)):
        test_fold_at_every_window_length(5, True, bf, bf, None)
        test_fold_at_every_window_length(12, False, fp16, fp16, None)
        test_ucache_flush_matches_flashinfer_semantics(128, 128, 2, 4, bf, bf, True, None)
        test_ucache_flush_matches_flashinfer_semantics(128, 128, 1, 8, bf, bf, False, None)


def test_flashinfers_flush_in_the_rows_form_with_short_steps():
    """FlashInfer's flush kernel with an fp32 state and rings at T 2 / 3 in the rows form (the rules' choice there from
    B * HV 2048 up; forced here at 6 rows): the caller's cursors through the prep and state launches."""
    with forcing(ROWS_F32):
        test_ucache_flush_matches_flashinfer_semantics(128, 128, 2, 2, f32, f32, True, None)
        test_ucache_flush_matches_flashinfer_semantics(64, 128, 4, 3, f32, f32, False, 9)
        test_ucache_verify_only_matches_flashinfer_semantics(128, 64, 2, 2, f32, f32)


@pytest.mark.parametrize("K,V,rep,T,sdt,rdt", [(128, 128, 2, 4, bf, bf), (64, 128, 4, 8, fp16, fp16),
                                               (256, 256, 1, 2, f32, f32)])
def test_ucache_verify_only_matches_flashinfer_semantics(K, V, rep, T, sdt, rdt):
    """gated_delta_rule_mtp_ucache over its flat 16-row ring: rows appended at hist_len..hist_len+T-1 from row 0, the
    checkpoint never written (every slot bit-exact), the caller rewinding hist_len = P + accepted with P + T <= 16."""
    H = 2 if rep < 4 else 1
    HV, B = H * rep, 5
    g = torch.Generator(device=DEV).manual_seed(K * V + T)
    rng = random.Random(T + 1)
    slots = B + 2
    pool, _ = _pool(g, slots, HV, V, K, sdt)
    kc, uc, gc = _ucache_rings(slots, H, HV, K, V, 16, rdt)
    model = LazyModel.from_cache(pool, (kc, uc, gc, None))
    A_log, dtb = _gate_params(g, HV)
    idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(i64)
    idx[1] = -1
    hist = torch.zeros(B, dtype=i32, device=DEV)
    pool0 = pool.clone()
    tol_out, tol_state = _tols(sdt, rdt, bf)
    for step in range(6):
        q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
        ref = model.ucache_step(q, k, v, A_log, a, dtb, b, idx, hist)
        out = torch.full((B, T, HV, V), float("nan"), dtype=bf, device=DEV)
        res = gdnjit.gated_delta_rule_mtp_ucache(A_log, a, dtb, q=q, k=k, v=v, b=b, initial_state_source=pool,
                                                 initial_state_indices=idx, k_cache=kc, u_cache=uc, g_cache=gc,
                                                 hist_len=hist, output=out)
        torch.cuda.synchronize()
        assert res.data_ptr() == out.data_ptr()
        live = [0, 2, 3, 4]
        assert _rel(out[live].float(), ref[live]) < tol_out, f"step {step}"
        assert torch.isnan(out[1].float()).all(), "a given output's padding row is untouched"
        assert torch.equal(pool, pool0), "the verify-only call never writes the state"
        for n, s in enumerate(idx.tolist()):
            if s >= 0:
                _check_rings(model, (kc, uc, gc), s, list(range(int(hist[n]) + T)), f"step {step} slot {s}",
                             tol_state)
        room = 16 - T - hist
        hist += torch.tensor([rng.randint(0, max(0, min(T, int(r)))) for r in room], dtype=i32, device=DEV)
    assert int(hist.max()) > 0


def test_ucache_contract_errors():
    """FlashInfer's asserted contracts: ContractError (a ValueError and an AssertionError); its unsupported
    arguments: NotImplementedError."""
    from gdnjit.errors import ContractError

    H, HV, K, V, B, T = 1, 2, 128, 128, 2, 4
    g = torch.Generator(device=DEV).manual_seed(0)
    pool, _ = _pool(g, 3, HV, V, K, bf)
    kc, uc, gc = (x.zero_() for x in _ucache_rings(3, H, HV, K, V, 32, bf))
    A_log, dtb = _gate_params(g, HV)
    q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
    kw = dict(q=q, k=k, v=v, b=b, initial_state_source=pool, initial_state_indices=torch.tensor([0, 2], dtype=i32,
                                                                                                  device=DEV),
              k_cache=kc, u_cache=uc, g_cache=gc)
    base = torch.zeros(B, dtype=i32, device=DEV)
    with pytest.raises(ContractError, match="hist_len"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, hist_len=torch.tensor([17, 0], dtype=i32, device=DEV),
                                                 cache_base=base, **kw)
    with pytest.raises(AssertionError, match="cache_base"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, hist_len=torch.zeros(B, dtype=i32, device=DEV),
                                                 cache_base=torch.tensor([0, 32], dtype=i32, device=DEV), **kw)
    with pytest.raises(ContractError, match="flush_min"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, hist_len=torch.zeros(B, dtype=i32, device=DEV),
                                                 cache_base=base, flush_min=14, **kw)
    with pytest.raises(ValueError, match="cache_base"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, hist_len=torch.zeros(B, dtype=i32, device=DEV), **kw)
    with pytest.raises(NotImplementedError, match="accepted_steps"):
        gdnjit.gated_delta_rule_mtp_ucache_flush(A_log, a, dtb, hist_len=torch.zeros(B, dtype=i32, device=DEV),
                                                 cache_base=base, accepted_steps=torch.zeros(B, dtype=i32), **kw)


def test_ucache_ring_errors_name_flashinfers_arguments():
    """A wrong ring names k_cache / u_cache / g_cache (FlashInfer's argument names), not q's k."""
    H, HV, K, V, B, T = 1, 2, 128, 128, 2, 4
    g = torch.Generator(device=DEV).manual_seed(0)
    pool, _ = _pool(g, 3, HV, V, K, bf)
    A_log, dtb = _gate_params(g, HV)
    q, k, v, a, b = _tokens(g, B, T, H, HV, K, V, bf)
    rings = [x.zero_() for x in _ucache_rings(3, H, HV, K, V, 16, bf)]
    kw = dict(q=q, k=k, v=v, b=b, initial_state_source=pool, hist_len=torch.zeros(B, dtype=i32, device=DEV))
    for i, name in enumerate(("k_cache", "u_cache", "g_cache")):
        bad = list(rings)
        bad[i] = torch.zeros(3, *rings[i].shape[1:-1], 2 * rings[i].shape[-1], dtype=rings[i].dtype, device=DEV)
        with pytest.raises(ValueError) as e:
            gdnjit.gated_delta_rule_mtp_ucache(A_log, a, dtb, k_cache=bad[0], u_cache=bad[1], g_cache=bad[2], **kw)
        assert str(e.value).startswith(name + ":"), str(e.value)


@pytest.mark.parametrize("T,speculative", [(1, False), (2, True)])
def test_tune_times_steps_and_its_window_is_kept(T, speculative, monkeypatch):
    """gdnjit tune over a lazy step (fp32 state and rings, the rules' rows shape with windows 8 and 16; plain T 1 and
    speculative T 2 at B * HV past the rows form's threshold): every candidate timed (its steps amortised over whole
    fold cycles), an entry naming the fastest; then a tuned table of the rows form with window 8 sends real steps
    (their prep launch takes the step's window: the prep decides the folds) through the dispatcher, against the
    model with window 8: outputs, checkpoints and cursors over three fold cycles, the folds where window 8 puts them."""
    from gdnjit import dispatch, runner
    from gdnjit.config import get_config
    from gdnjit.shapes import Problem
    from gdnjit.spec import get_spec
    from gdnjit.tune import tune
    from gdnjit.tuned import TunedTable

    H, HV, K, V, B = 4, 16, 128, 128, 129  # B * HV 2064: the rules' rows form at T 1 and T 2 (fp32)
    spec = get_spec("gdn_lazy")
    params = dict(spec.param_defaults, mode="step", pending=speculative, T=T, K=K, V=V, state_dtype="fp32",
                  ring_dtype="fp32", idx_dtype="int32", zero_pad=True)
    prob = Problem("lazy_step", "m", 1, "gdn_lazy", tuple((n, params[n]) for n in spec.param_names),
                   (("H", H), ("HV", HV)), "B", (B,))
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rule = dispatch.select(spec, dict(prob.params), dict(prob.facts, B=B, num_sms=sms))[0]
    assert rule["form"] == "rows" and rule["window"] == 16, rule
    lines = []  # the candidates: the rules' rows shape with windows 8 and 16
    entries = tune([prob], get_config(), torch.cuda.current_device(), where=f"form == 'rows' and tile_v == "
                   f"{rule['tile_v']} and lanes_per_row == {rule['lanes_per_row']} and rows_per_lane == "
                   f"{rule['rows_per_lane']}", log=lines.append)
    assert len(entries) == 1 and len(lines) == 1, lines
    e = entries[0]
    timed = {t["window"]: x["us"] for x in e["top"] for t in [x["tunables"]]}
    assert e["candidates"] == 2 and set(timed) == {8, 16} and all(0 < us < 1e4 for us in timed.values()), e
    assert e["tunables"]["form"] == "rows" and e["us"] == min(timed.values()) and e["rule_us"] == timed[16], e
    w8 = dict(e["tunables"], window=8)
    table = TunedTable([{"spec": "gdn_lazy", "params": e["params"], "facts": e["facts"], "tunables": w8}])
    monkeypatch.setattr(runner.RUNNER, "tuned_table", lambda i: table)
    runner.RUNNER.clear()
    try:
        g = torch.Generator(device=DEV).manual_seed(11 + T)
        slots = B + 3
        pool, _ = _pool(g, slots, HV, V, K, f32)
        cache, _ = _poisoned_cache(slots, H, HV, K, V, f32)
        A_log, dtb = _gate_params(g, HV)
        model = LazyModel.from_cache(pool, cache, window=8)
        idx = torch.randperm(slots, device=DEV, generator=g)[:B].to(i32)
        idx[5] = -1
        tol_out, tol_state = _tols(f32, f32, bf)
        acc = None
        for i in range(3 * (8 - T + 1) + 2):
            toks = _tokens(g, B, T, H, HV, K, V, bf)
            ref = model.step(*toks[:3], A_log, toks[3], dtb, toks[4], idx, acc)
            before = pool.clone()
            out = gdnjit.gated_delta_rule_lazy_step(*toks[:3], A_log, toks[3], dtb, toks[4], pool, idx, cache,
                                                    num_accepted=acc)
            torch.cuda.synchronize()
            live = [n for n in range(B) if n != 5]
            assert _rel(out[live].float(), ref[live]) < tol_out, i
            _check_pool(model, pool, before, idx.tolist(), tol_state, f"step {i}")
            assert torch.equal(cache.cursor.cpu(), model.cursor), i
            if speculative:
                acc = torch.randint(0, T + 1, (B,), device=DEV, generator=g, dtype=i32)
        assert int(model.cursor[:, 0].max()) <= 8  # window 8's folds, not 16's
    finally:
        runner.RUNNER.clear()
