"""Benchmark gdnjit's gated-delta-rule (GDN) decode against fla's Triton kernel.

Usage (GPU machine, fla + triton importable, repo root as working dir)::

    PYTHONPATH=/tmp/site:$PWD python3 tools/bench_gdn.py --out $OUT
    PYTHONPATH=/tmp/site:$PWD python3 tools/bench_gdn.py --quick --check --out $OUT
    PYTHONPATH=/tmp/site:$PWD python3 tools/bench_gdn.py --hv 64 --b 1 512 --t 1 2
    python3 tools/bench_gdn.py --dry-run          # print the planned grid, no GPU

Grid (defaults): H=16 q/k heads, HV in {64, 32} v heads, K=V=128,
B in {1, 8, 32, 64, 128, 512}, T in {1, 2, 4, 8}, fp32 state [B, HV, V, K],
bf16 q/k/v/a/b, fp32 A_log/dt_bias.  ``--quick`` uses B in {1, 32, 512},
T in {1, 4} and fewer repetitions (explicit --hv/--b/--t still win).

Implementations (each row times both, same inputs):

* gdnjit: ``gated_delta_rule_decode_pretranspose`` (state updated in place,
  preallocated ``output``).  For T > 1, if that raises NotImplementedError or
  ValueError, ``gated_delta_rule_mtp`` (pool = the same [B, HV, V, K] state,
  indices arange(B)) is tried; if neither works the gdnjit cells stay empty
  and a note is printed.  The API used is in the ``api`` column.
* fla 0.6.0: ``fused_recurrent_gated_delta_rule_fwd(..., state_v_first=True,
  output_final_state=True)`` with the gate (-exp(A_log) * softplus(a +
  dt_bias)) and sigmoid(b) computed in-kernel.  It reads ``initial_state``
  and writes the final state and output into fresh tensors (no in-place
  update, no output argument): the same bytes as gdnjit's in-place update.
  If fla cannot be imported or rejects the call, its columns stay empty.

Numbers per (HV, B, T), all µs per call:

* floor: (state read + state write + q + k + v + o + a + b + A_log + dt_bias
  bytes) / copy bandwidth, the latter measured once at start
  (``bench_common.copy_bandwidths``: 1 GiB device-to-device copy, read+write,
  best of eager cudaMemcpy and a graph-replayed SM copy kernel).
* graph: device time per call from CUDA-graph replays (``time_graph``).
* eager: per-call wall time of back-to-back eager calls incl. one closing
  synchronize per burst (``time_eager``), ~max(host launch cost, device time).
* host (results.json / results.md only): host enqueue cost per call.
* Each timed number is followed by its fraction of the floor, floor_us / us
  (1.0 = at the copy-bandwidth floor).

Rotation: each row allocates ``sets`` independent input sets (state, q, k, v,
a, b, output) so that the state working set is >= 3x L2 (at least 2 sets;
memory capped by ``--mem-cap-gb``, counting fla's freshly allocated outputs,
which rotate too); consecutive calls use consecutive sets.  Rows whose working
set is still < 2x L2 are flagged ``L2``.

``--check`` compares, before timing, each implementation's output and final
state on a pristine copy of set 0 with a float32 PyTorch reference and with
each other (relative error ||x - y|| / ||y||).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import os
import sys
import traceback
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, last

import bench_common as bc  # noqa: E402

GB = 1e9
MiB = 2**20
ASSUMED_L2_MIB = 50  # H100 / H200, used by --dry-run when no GPU is visible


# ----------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------

def _ints(values) -> list[int] | None:
    """['64,32', '16'] -> [64, 32, 16]; None stays None."""
    return None if values is None else [int(x) for v in values for x in v.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark gdnjit GDN decode vs fla fused_recurrent (see module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ints = dict(nargs="+", action="extend", metavar="N")
    p.add_argument("--hv", **ints, help="value heads HV (space or comma separated) [64 32]")
    p.add_argument("--b", **ints, help="batch sizes B [1 8 32 64 128 512]")
    p.add_argument("--t", **ints, help="tokens per call T [1 2 4 8]")
    p.add_argument("--h", type=int, default=16, help="q/k heads H")
    p.add_argument("--k", type=int, default=128, help="key dim K")
    p.add_argument("--v", type=int, default=128, help="value dim V")
    p.add_argument("--quick", action="store_true", help="smaller grid, fewer repetitions")
    p.add_argument("--check", action="store_true", help="compare outputs/states before timing")
    p.add_argument("--no-fla", action="store_true", help="skip the fla columns")
    p.add_argument("--out", metavar="DIR", help="write results.json and results.md into DIR")
    p.add_argument("--dry-run", action="store_true", help="print the planned grid and exit")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mem-cap-gb", type=float, default=20.0,
                   help="cap on rotation memory per row (input sets + fla outputs)")
    p.add_argument("--l2-factor", type=float, default=3.0,
                   help="target state working set, in multiples of L2")
    p.add_argument("--replays", type=int, help="graph replays [50, quick: 20]")
    p.add_argument("--bursts", type=int, help="eager bursts [7, quick: 3]")
    p.add_argument("--eager-iters", type=int, default=20, help="calls per eager burst")
    a = p.parse_args(argv)
    a.hv = _ints(a.hv) or [64, 32]
    a.b = _ints(a.b) or ([1, 32, 512] if a.quick else [1, 8, 32, 64, 128, 512])
    a.t = _ints(a.t) or ([1, 4] if a.quick else [1, 2, 4, 8])
    a.replays = a.replays or (20 if a.quick else 50)
    a.bursts = a.bursts or (3 if a.quick else 7)
    for hv in a.hv:
        if hv % a.h:
            p.error(f"HV={hv} must be a multiple of H={a.h}")
    return a


# ----------------------------------------------------------------------------
# shapes, byte counts, rotation plan
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Shape:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int

    @property
    def state_bytes(self) -> int:  # fp32 [B, HV, V, K]
        return self.B * self.HV * self.V * self.K * 4

    @property
    def io_bytes(self) -> int:
        """q, k, v, o, a, b (bf16) once each, plus A_log and dt_bias (fp32)."""
        B, T = self.B, self.T
        qk = 2 * B * T * self.H * self.K * 2
        vo = 2 * B * T * self.HV * self.V * 2
        ab = 2 * B * T * self.HV * 2
        return qk + vo + ab + 2 * self.HV * 4

    @property
    def floor_bytes(self) -> int:
        return 2 * self.state_bytes + self.io_bytes

    @property
    def set_bytes(self) -> int:
        """One input set: state + q, k, v, a, b + preallocated output."""
        return self.state_bytes + self.io_bytes

    @property
    def peer_out_bytes(self) -> int:
        """What fla allocates per call: final state + output."""
        return self.state_bytes + self.B * self.T * self.HV * self.V * 2


@dataclasses.dataclass
class Plan:
    shape: Shape
    n_sets: int
    working_set: int  # state bytes touched per rotation
    mem_bytes: int    # estimated allocation for the row
    l2_resident: bool


def plan_row(shape: Shape, l2: int, cap_bytes: float, factor: float) -> Plan:
    want = max(2, math.ceil(factor * l2 / shape.state_bytes))
    per_set = shape.set_bytes + shape.peer_out_bytes
    fit = max(1, int(cap_bytes // per_set))
    n = min(want, fit)
    ws = n * shape.state_bytes
    return Plan(shape, n, ws, n * per_set, ws < 2 * l2)


def plan_grid(args, l2: int) -> list[Plan]:
    return [
        plan_row(Shape(B, T, args.h, hv, args.k, args.v), l2, args.mem_cap_gb * GB, args.l2_factor)
        for hv in args.hv for B in args.b for T in args.t
    ]


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class InputSet:
    q: torch.Tensor      # [B, T, H, K] bf16
    k: torch.Tensor      # [B, T, H, K] bf16
    v: torch.Tensor      # [B, T, HV, V] bf16
    a: torch.Tensor      # [B, T, HV] bf16
    b: torch.Tensor      # [B, T, HV] bf16
    state: torch.Tensor  # [B, HV, V, K] fp32
    out: torch.Tensor    # [B, T, HV, V] bf16, preallocated output


@dataclasses.dataclass
class Params:
    A_log: torch.Tensor    # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    idx: torch.Tensor      # [B] int32, pool indices for the mtp API
    scale: float


def make_params(s: Shape, dev) -> Params:
    A_log = torch.empty(s.HV, device=dev).uniform_(1, 16).log_()
    dt_bias = torch.randn(s.HV, device=dev)
    idx = torch.arange(s.B, dtype=torch.int32, device=dev)
    return Params(A_log, dt_bias, idx, s.K ** -0.5)


def make_set(s: Shape, dev) -> InputSet:
    bf = dict(dtype=torch.bfloat16, device=dev)
    return InputSet(
        q=torch.randn(s.B, s.T, s.H, s.K, **bf),
        k=torch.randn(s.B, s.T, s.H, s.K, **bf),
        v=torch.randn(s.B, s.T, s.HV, s.V, **bf),
        a=torch.randn(s.B, s.T, s.HV, **bf),
        b=torch.randn(s.B, s.T, s.HV, **bf),
        state=torch.randn(s.B, s.HV, s.V, s.K, dtype=torch.float32, device=dev),
        out=torch.randn(s.B, s.T, s.HV, s.V, **bf),
    )


def scratch_copy(s: InputSet) -> InputSet:
    """Set sharing s's inputs, with a private state copy and a NaN-poisoned output."""
    return dataclasses.replace(s, state=s.state.clone(), out=torch.full_like(s.out, float("nan")))


# ----------------------------------------------------------------------------
# implementations: each caller maps (InputSet, Params) -> (output, final state)
# ----------------------------------------------------------------------------

Caller = Callable[[InputSet, Params], "tuple[torch.Tensor, torch.Tensor]"]


_GDNJIT = None  # the gdnjit module, set by load_impls
_FLA_FWD = None  # fla's fused_recurrent_gated_delta_rule_fwd, set by load_impls


def gdn_decode(s: InputSet, p: Params):
    return _GDNJIT.gated_delta_rule_decode_pretranspose(
        s.q, s.k, s.v, s.state, p.A_log, s.a, p.dt_bias, s.b,
        scale=p.scale, output=s.out, use_qk_l2norm=True)


def gdn_mtp(s: InputSet, p: Params):
    """MTP API with the state as a pool of B slots, slot i for row i, updated in place."""
    return _GDNJIT.gated_delta_rule_mtp(
        s.q, s.k, s.v, s.state, p.idx, p.A_log, s.a, p.dt_bias, s.b,
        scale=p.scale, output=s.out, use_qk_l2norm=True, disable_state_update=False)


def fla_fwd(s: InputSet, p: Params):
    return _FLA_FWD(
        s.q, s.k, s.v, g=s.a, beta=s.b, A_log=p.A_log, dt_bias=p.dt_bias,
        scale=p.scale, initial_state=s.state, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        state_v_first=True)


def reference(s: InputSet, p: Params):
    """float32 PyTorch recurrence with fla's semantics (GQA: v head hv uses q/k
    head hv // (HV // H); l2norm eps 1e-6 inside the sqrt; q scaled after
    normalization)."""
    rep = s.v.shape[2] // s.q.shape[2]

    def l2n(x):
        x = x.float()
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    q = l2n(s.q).repeat_interleave(rep, dim=2) * p.scale  # [B, T, HV, K]
    k = l2n(s.k).repeat_interleave(rep, dim=2)
    decay = torch.exp(-p.A_log.exp() * F.softplus(s.a.float() + p.dt_bias))  # [B, T, HV]
    beta = torch.sigmoid(s.b.float())
    h = s.state.clone()
    o = torch.empty(s.out.shape, dtype=torch.float32, device=h.device)
    for t in range(s.q.shape[1]):
        h.mul_(decay[:, t, :, None, None])
        kt = k[:, t, :, None, :]                                  # [B, HV, 1, K]
        u = beta[:, t, :, None] * (s.v[:, t].float() - (h * kt).sum(-1))
        h.add_(u[..., None] * kt)
        o[:, t] = (h * q[:, t, :, None, :]).sum(-1)
    return o, h


# ----------------------------------------------------------------------------
# bookkeeping
# ----------------------------------------------------------------------------

class Notes:
    """Collects notes for results.md; prints each key's message once."""

    def __init__(self):
        self.seen: set = set()
        self.lines: list[str] = []

    def add(self, key, msg: str):
        if key in self.seen:
            return
        self.seen.add(key)
        self.lines.append(msg)
        print(f"NOTE: {msg}", flush=True)


def short(e: BaseException) -> str:
    """'Type: first line of the message' (CUDA errors carry long hints)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.float(), y.float()
    return ((x - y).norm() / y.norm()).item()


def first_call(caller: Caller, s0: InputSet, p: Params):
    """Run caller once on a scratch copy of s0 (compiles, probes support);
    return its (output, final state)."""
    ret = caller(scratch_copy(s0), p)
    torch.cuda.synchronize()
    return ret


def resolve_gdn(shape: Shape, s0: InputSet, p: Params, notes: Notes):
    """Pick the gdnjit API for this T; returns (api, caller, result) or None."""
    candidates = [("decode", gdn_decode)]
    if shape.T > 1:
        if hasattr(_GDNJIT, "gated_delta_rule_mtp"):
            candidates.append(("mtp", gdn_mtp))
        else:
            notes.add("no-mtp", "gdnjit.gated_delta_rule_mtp not found")
    for api, caller in candidates:
        try:
            return api, caller, first_call(caller, s0, p)
        except (NotImplementedError, ValueError) as e:
            notes.add(("unsupported", api, shape.T),
                      f"gdnjit {api} T={shape.T}: {short(e)} -> skipped")
    return None


def measure(caller: Caller, sets: list[InputSet], p: Params, args, tag: str, notes: Notes) -> dict:
    """graph / eager / host µs per call of caller, rotating through sets."""
    fn = lambda i: caller(sets[i], p)  # noqa: E731
    n = len(sets)
    res = {}
    try:
        res["graph_us"] = bc.time_graph(fn, n, calls=10, replays=args.replays)
    except Exception as e:
        res["graph_us"], res["graph_error"] = None, short(e)
        notes.add(("graph", tag), f"{tag}: CUDA graph capture/replay failed: {res['graph_error']}")
        torch.cuda.synchronize()
    common = dict(n_sets=n, iters=args.eager_iters, bursts=args.bursts)
    res["eager_us"] = bc.time_eager(fn, include_sync=True, **common)
    res["host_us"] = bc.time_eager(fn, include_sync=False, **common)
    return res


# ----------------------------------------------------------------------------
# one row
# ----------------------------------------------------------------------------

def guarded(rec: dict, notes: Notes, tag: str, fn: Callable):
    """fn() or, if it raises, None with the error recorded in rec (traceback
    printed once per tag and exception type)."""
    try:
        return fn()
    except Exception as e:
        msg = f"{tag}: {short(e)}"
        rec["errors"].append(msg)
        print(f"ERROR HV={rec['hv']} B={rec['b']} T={rec['t']} {msg}", flush=True)
        if (tag, type(e)) not in notes.seen:
            notes.seen.add((tag, type(e)))
            traceback.print_exc()
        return None


def probe_fla(s0: InputSet, p: Params, impls: dict, notes: Notes):
    """fla's first call on set 0, or None; a TypeError (signature mismatch)
    disables fla for the rest of the run."""
    try:
        return first_call(fla_fwd, s0, p)
    except TypeError as e:
        notes.add("fla-sig", f"fla call rejected ({short(e)}); fla columns skipped")
        impls.pop("fla", None)
        return None


def run_row(plan: Plan, args, bw: float, impls: dict, notes: Notes) -> dict:
    s = plan.shape
    dev = torch.device(args.device)
    rec = dict(hv=s.HV, b=s.B, t=s.T, h=s.H, k=s.K, v=s.V, sets=plan.n_sets,
               working_set_bytes=plan.working_set, l2_resident=plan.l2_resident,
               floor_bytes=s.floor_bytes, floor_us=s.floor_bytes / bw * 1e6, errors=[])
    p = make_params(s, dev)
    sets = [make_set(s, dev) for _ in range(plan.n_sets)]

    # First call of each implementation (compiles, probes support) on a
    # pristine scratch copy of set 0; its result feeds --check.
    results, callers = {}, {}
    if "gdn" in impls:
        resolved = guarded(rec, notes, "gdn", lambda: resolve_gdn(s, sets[0], p, notes))
        if resolved:
            rec["api"], callers["gdn"], results["gdn"] = resolved
    if "fla" in impls:
        res = guarded(rec, notes, "fla", lambda: probe_fla(sets[0], p, impls, notes))
        if res is not None:
            callers["fla"], results["fla"] = fla_fwd, res
    if args.check:
        rec["check"] = guarded(rec, notes, "check", lambda: check_row(s, sets[0], p, results))
    del results

    for name, caller in callers.items():
        timed = guarded(rec, notes, f"{name} timing",
                        lambda: measure(caller, sets, p, args, name, notes)) or {}
        for key, us in timed.items():
            rec[f"{name}_{key}"] = us
    for name in ("gdn", "fla"):
        for key in ("graph", "eager"):
            us = rec.get(f"{name}_{key}_us")
            rec[f"{name}_{key}_frac"] = rec["floor_us"] / us if us else None
    del sets
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rec


def check_row(s: Shape, s0: InputSet, p: Params, results: dict) -> dict:
    """Relative errors of output / final state: each impl vs reference, gdn vs fla."""
    results = dict(results, ref=reference(s0, p))
    pairs = [(n, "ref") for n in ("gdn", "fla") if n in results]
    if "gdn" in results and "fla" in results:
        pairs.append(("gdn", "fla"))
    chk = {}
    for x, y in pairs:
        chk[f"{x}~{y}"] = dict(o=rel_err(results[x][0], results[y][0]),
                              state=rel_err(results[x][1], results[y][1]))
    ok = all(e["o"] < 2e-2 and e["state"] < 1e-3 for e in chk.values())  # NaN fails too
    chk["ok"] = ok
    line = "  ".join(f"{k}: o {v['o']:.1e} state {v['state']:.1e}"
                     for k, v in chk.items() if k != "ok")
    print(f"check HV={s.HV} B={s.B} T={s.T}  {line}  {'ok' if ok else 'SUSPECT'}", flush=True)
    return chk


# ----------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------

def _cell(us, frac):
    return None if us is None else f"{us:.1f} ({frac:.2f})"


TABLE_HEADERS = ["HV", "B", "T", "sets", "floor us", "gdn graph", "gdn eager",
                 "fla graph", "fla eager", "fla/gdn", "flags"]


def table_rows(records: list[dict]) -> list[list]:
    rows = []
    for r in records:
        g, f = r.get("gdn_graph_us"), r.get("fla_graph_us")
        flags = [x for x in (
            "L2" if r["l2_resident"] else "",
            r.get("api", "") if r.get("api", "decode") != "decode" else "",
            "" if (r.get("check") or {}).get("ok", True) else "CHECK",
            "ERR" if r["errors"] else "",
        ) if x]
        rows.append([
            r["hv"], r["b"], r["t"], r["sets"], f"{r['floor_us']:.1f}",
            _cell(g, r.get("gdn_graph_frac")), _cell(r.get("gdn_eager_us"), r.get("gdn_eager_frac")),
            _cell(f, r.get("fla_graph_frac")), _cell(r.get("fla_eager_us"), r.get("fla_eager_frac")),
            f"{f / g:.2f}" if f and g else None, ",".join(flags),
        ])
    return rows


MD_EXTRA_HEADERS = ["gdn host", "fla host"]


def md_rows(records: list[dict]) -> list[list]:
    fmt = lambda x: None if x is None else f"{x:.1f}"  # noqa: E731
    return [row + [fmt(r.get("gdn_host_us")), fmt(r.get("fla_host_us"))]
            for row, r in zip(table_rows(records), records)]


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------

def dry_run(args):
    if torch.cuda.is_available():
        l2, src = bc.l2_bytes(args.device), "device"
    else:
        l2, src = ASSUMED_L2_MIB * MiB, "assumed, no GPU visible"
    plans = plan_grid(args, l2)
    print(f"L2 = {l2 / MiB:.0f} MiB ({src}); mem cap {args.mem_cap_gb} GB/row; "
          f"target state working set {args.l2_factor}x L2; "
          f"replays {args.replays}, bursts {args.bursts} x {args.eager_iters}")
    headers = ["HV", "B", "T", "sets", "state/set MiB", "ws MiB", "floor MB", "row mem GB", "flags"]
    rows = [[pl.shape.HV, pl.shape.B, pl.shape.T, pl.n_sets, f"{pl.shape.state_bytes / MiB:.1f}",
             f"{pl.working_set / MiB:.0f}", f"{pl.shape.floor_bytes / 1e6:.2f}",
             f"{pl.mem_bytes / GB:.2f}", "L2" if pl.l2_resident else ""] for pl in plans]
    print(bc.format_table(headers, rows))
    print(f"{len(plans)} rows")


def load_impls(args, notes: Notes) -> dict:
    """{'gdn': version, 'fla': version} for the importable implementations."""
    global _GDNJIT, _FLA_FWD
    impls = {}
    try:
        import gdnjit
        if not hasattr(gdnjit, "gated_delta_rule_decode_pretranspose"):
            raise ImportError(f"no gated_delta_rule_decode_pretranspose in {gdnjit!r}")
        _GDNJIT = gdnjit
        impls["gdn"] = getattr(gdnjit, "__version__", "?")
    except Exception as e:
        notes.add("gdn-import", f"cannot import gdnjit ({short(e)}); gdnjit columns skipped")
    if args.no_fla:
        return impls
    try:
        import fla
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd
    except Exception as e:  # ImportError, or fla incompatible with the installed triton
        notes.add("fla-import", f"cannot import fla ({short(e)}); fla columns skipped")
        return impls
    needed = {"g", "beta", "A_log", "dt_bias", "scale", "initial_state", "output_final_state",
              "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "state_v_first"}
    missing = needed - set(inspect.signature(fused_recurrent_gated_delta_rule_fwd).parameters)
    if missing:
        notes.add("fla-sig", f"fla fused_recurrent_gated_delta_rule_fwd lacks {sorted(missing)}; "
                             "fla columns skipped")
        return impls
    _FLA_FWD = fused_recurrent_gated_delta_rule_fwd
    impls["fla"] = getattr(fla, "__version__", "?")
    return impls


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device visible; use --dry-run to print the plan", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    if dev.index is None:
        dev = torch.device(dev.type, torch.cuda.current_device())
    args.device = str(dev)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    notes = Notes()
    impls = load_impls(args, notes)

    meta = bc.env_info(args.device)
    l2 = bc.l2_bytes(args.device)
    bws = bc.copy_bandwidths(args.device)
    bw = max(bws.values())
    meta.update(copy_bw_tbs=round(bw / 1e12, 3),
                copy_bw_detail_tbs={k: round(v / 1e12, 3) for k, v in bws.items()},
                gdnjit=impls.get("gdn"), fla=impls.get("fla"), args=vars(args))
    print(f"{meta.get('device')}: copy bandwidth {bw / 1e12:.2f} TB/s, L2 {l2 / MiB:.0f} MiB", flush=True)

    records = []
    print(bc.format_table(TABLE_HEADERS, []), flush=True)  # header for the progress rows
    for plan in plan_grid(args, l2):
        s = plan.shape
        try:
            rec = run_row(plan, args, bw, impls, notes)
        except torch.cuda.OutOfMemoryError as e:
            notes.add(("oom", s), f"HV={s.HV} B={s.B} T={s.T}: {short(e)}; row skipped")
            torch.cuda.empty_cache()
            continue
        records.append(rec)
        print(bc.format_table(TABLE_HEADERS, table_rows([rec])).splitlines()[-1], flush=True)

    title = (f"GDN decode: gdnjit {impls.get('gdn', '-')} vs fla {impls.get('fla', '-')} "
             f"on {meta.get('device')}")
    header = (f"{title}\ntorch {meta['torch']} (CUDA {meta['cuda_runtime']}), "
              f"triton {meta['triton']}, copy bandwidth {bw / 1e12:.2f} TB/s, "
              f"L2 {l2 / MiB:.0f} MiB\ncells: us per call (floor_us / us); "
              f"fla/gdn = fla graph / gdn graph; flags: L2 = working set < 2x L2, "
              f"mtp = gdnjit via gated_delta_rule_mtp, CHECK = --check suspect, ERR = see output")
    if args.out:
        paths = bc.write_results(args.out, meta, records, TABLE_HEADERS + MD_EXTRA_HEADERS,
                                 md_rows(records), title=title, notes=notes.lines)
        print("wrote " + ", ".join(paths))
    print()
    for line in notes.lines:
        print(f"note: {line}")
    print(header)
    print(bc.format_table(TABLE_HEADERS, table_rows(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
