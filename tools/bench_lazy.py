"""Lazy-state GDN (docs/design.md section 11) per step of one layer, against plain decode, gdnjit's fused speculative
step and FlashInfer's u-cache, with the bandwidth floors measured in the same run.

    PYTHONPATH=$PWD python3 tools/bench_lazy.py [--quick] [--b ...] [--hv ...] [--t ...] [--state ...] [--no-fi]
                                               [--fi-only] [--budget-s S] [--out DIR]

Per (state dtype, HV, B): B requests, H = 16, K = V = 128, bf16 q/k/v/a/b, fp32 A_log / dt_bias, a pool of B + 1
state slots (random distinct slots per request). Columns, microseconds per step (per token for T = 1):

  decode   gdnjit.gated_delta_rule_decode_pretranspose, T = 1 over the pool (reads and writes the state every token)
  lazy1    gdnjit.gated_delta_rule_lazy_step, T = 1, num_accepted=None (plain decoding), amortised over its folds
  copy     an SM copy of the B requests' states (two state passes; `torch.mul(src, 1, out=dst)`): what the floor's
           passes cost at this size
  fused    gdnjit.gated_delta_rule_spec_step, T in --t (4 8), accepted counts 1, T/2, T and random 1..T
  lazy     gdnjit.gated_delta_rule_lazy_step(num_accepted=...), T in --t, the same accepted counts
  fi       FlashInfer 0.7.2.post1's flashinfer.gdn_kernels.gated_delta_rule_mtp_ucache_flush (bf16 state, T 4 / 8),
           the same accepted counts; only where it imports (else a line says why; --no-fi skips it)

Amortisation. A lazy step's cost depends on the slot's ring fill P (rows it reads) and on whether it folds (writes the
state). Its cursor lives on the device and the kernel commits it, so it cannot be pinned inside a graph; instead each
graph holds, per input set, whole fold cycles of consecutive steps (cursor evolving naturally from an empty ring,
zeroed before each column; a steady accepted count n folds every ceil(fold_at / n) steps, fold_at = window - T + 1
from the variant the dispatcher picks; T = 1: every `window` steps, the first fold of an empty ring at step window + 1),
and its time is divided by the steps: the amortised cost per step, exactly (folds are periodic from the first one on,
which comes at the latest at the first timed replay's first step, so every timed replay does the same work).
Random accepted counts: 48 steps a set, per-step tensors of uniform 1..T per request (the same sequence for fused,
lazy and fi; the fold count per replay then varies a little). FlashInfer's cursors are the caller's: its graph replays
a trajectory of hist_len / cache_base
(restart_hist_on_flush=False) simulated with the same accepted counts and FlashInfer's commit rule (fold at hist_len
>= flush_min = 16 - T + 1, then base += P, hist_len = accepted; else hist_len += accepted), starting in steady state.
Its stationary points (hist_len 0: a verify without ring, hist_len = flush_min: every row folds) are in the JSON too.
FlashInfer runs in a worker process (a crash there cannot take the rest of the run down): a case that raises, or a
worker that dies on one (a CUDA fault poisons its context), is reported as `FI error` / `FI crash` with the reason, and
a fresh worker goes on with the next case.

Floors (microseconds at the copy bandwidth measured in this run, bench_common.copy_bandwidth, read + write counted):
  read     one pass over the B states (one read)
  r+w      two passes (a read and a write): plain decode's state traffic
  lazy fl  one read + the P ring rows read (mean P of the trajectory) + the T rows appended + q/k/v/a/b/o, plus a
           fold's two passes (a read and a write of the state) times the folds per step; the same for fi (bf16
           rings). The JSON also has `floor_inlaunch_us`: a fold inside the step's launch reuses the step's read, so
           only its write counts. Where the dispatcher gives plain steps the eager form (window 0: an fp32 state's
           small batches), lazy1's floor is the decode's: the state read and written every step, no ring rows.
  decode / fused floors as tools/bench_spec.py (two passes + I/O; fused: + the raw tokens cached and read back).
frac = floor / measured. Ratios: lazy1 / decode, lazy / fi, lazy / fused.

Timing: CUDA-graph replays (median of --replays) of calls rotating over input sets (the states' working set >= 3x L2,
tools/bench_common.py conventions). Prints the tables and writes DIR/lazy.json (--out, default $OUT; rewritten after
every row, so a run cut short keeps what it measured) and DIR/lazy.md. --budget-s stops starting new rows after
that many seconds (the device's commands are limited to 10 minutes; --fi-only runs the FlashInfer side alone).
--dry-run (no GPU): builds one small input set on the CPU and prints the planned rows, fold rates and floors.

FlashInfer on the GPU machine (not a dependency of gdnjit): `flashinfer.gdn_kernels.gated_delta_rule_mtp_ucache_flush`
(0.7.2.post1) and `nvidia-cutlass-dsl` 4.8.1 (libs base, core, cu13) importable, e.g. wheels carried in an ignored
folder and installed with `python3 -m pip install -q --no-index --no-deps --target /tmp/site <wheels>`, then
`PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages`. The u-cache module needs only its own file and
`gdn_kernels/device_target.py` (a two-file package does); the cu13 libs' two large shared objects (193 + 44 MB) exceed
one device call's carry even as a wheel, but xz-compressed (50 + 13 MB) they go over two back-to-back calls (an ignored
path stays on a warm machine; session 47, docs/bench/2026-11-29-h200-s47-lazy.txt). The worker drops
GDN_UCACHE_{IO,STATE,RING}_DTYPE from its environment, so FlashInfer's module is the bf16 one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch

import gdnjit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

H, K, V = 16, 128, 128
RING = 32               # physical ring rows (gdnjit's LazyCache and FlashInfer's flush call)
FI_WINDOW = 16          # FlashInfer's W_RING
MIN_STEPS = 16          # steps a set per graph for steady accepted counts (rounded up to whole fold cycles)
RAND_STEPS = 48         # steps a set per graph for random accepted counts
DRY_RUN_L2 = 50 << 20   # an H100's L2, to plan the number of input sets without a GPU
UCACHE_ENV = ("GDN_UCACHE_IO_DTYPE", "GDN_UCACHE_STATE_DTYPE", "GDN_UCACHE_RING_DTYPE")
bf = torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# Accepted counts, cursor trajectories, fold rates (host side, no GPU)
# ---------------------------------------------------------------------------------------------------------------

def acc_labels(T: int) -> list:
    """The accepted-count columns of a T: steady 1, T/2, T (each once) and random."""
    return [str(n) for n in sorted({1, max(1, T // 2), T})] + ["rand"]


def steps_for(label: str, fold_at: int) -> int:
    """Steps a set per graph: whole fold cycles (a steady count n folds every ceil(fold_at / n) steps), at least
    MIN_STEPS; random counts: RAND_STEPS."""
    if label == "rand":
        return RAND_STEPS
    m = max(1, -(-fold_at // int(label)))
    return m * -(-MIN_STEPS // m)


def accept_sequences(B: int, T: int, label: str, steps: int, n_sets: int, seed: int) -> torch.Tensor:
    """int64 [n_sets, steps, B] (CPU): the accepted count of each request at each step (of that step's T drafts);
    the same in every process for the same arguments."""
    if label != "rand":
        return torch.full((n_sets, steps, B), int(label), dtype=torch.int64)
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * T + B)
    return torch.randint(1, T + 1, (n_sets, steps, B), generator=g, dtype=torch.int64)


def simulate(acc: torch.Tensor, T: int, fold_at: int, plain: bool = False, warm_cycles: int = 3):
    """The cursor trajectory of one set: ``acc [steps, B]`` accepted counts (ignored when ``plain``: T rows commit
    every step). Per step: P (the committed rows the step reads: FlashInfer's hist_len, gdnjit's len + accepted), the
    ring base and whether the step folds (P >= fold_at; then base += P, P restarts). The sequence repeats: returns
    ``(P, base, fold)`` int64/bool ``[steps, B]`` of the cycle after ``warm_cycles`` warm-up cycles (steady state)."""
    steps, B = acc.shape
    P = torch.zeros(B, dtype=torch.int64)
    base = torch.zeros(B, dtype=torch.int64)
    rec_P, rec_base, rec_fold = [], [], []
    for cycle in range(warm_cycles + 1):
        for j in range(steps):
            fold = P >= fold_at
            if cycle == warm_cycles:
                rec_P.append(P.clone())
                rec_base.append(base.clone())
                rec_fold.append(fold.clone())
            base = torch.where(fold, (base + P) % RING, base)
            P = torch.where(fold, torch.zeros_like(P), P) + (T if plain else acc[j])
    return torch.stack(rec_P), torch.stack(rec_base), torch.stack(rec_fold)


def traffic(P: torch.Tensor, fold: torch.Tensor) -> tuple:
    """(folds per step per request, mean ring rows read per step per request) of a trajectory."""
    return float(fold.double().mean()), float(P.double().mean())


# ---------------------------------------------------------------------------------------------------------------
# Floors (bytes per step)
# ---------------------------------------------------------------------------------------------------------------

def state_bytes(B: int, HV: int, es: int) -> int:
    return B * HV * V * K * es


def io_bytes(B: int, T: int, HV: int) -> int:
    """q, k, v, output, a, b of T tokens (bf16)."""
    return B * T * (2 * H * K + 2 * HV * V + 2 * HV) * 2


def ring_row_bytes(HV: int, rs: int) -> int:
    """One ring row of a slot: normalised k (per q/k head), u (per value head) in the ring dtype, G fp32."""
    return H * K * rs + HV * V * rs + HV * 4


def lazy_floor(B: int, T: int, HV: int, es: int, rs: int, fold_rate: float, P_mean: float,
               fold_passes: float = 2.0) -> float:
    """One state read + P ring rows read + T rows appended + the tokens' I/O, plus ``fold_passes`` state passes
    a fold times the folds per step (module docstring)."""
    st = state_bytes(B, HV, es)
    return (st + B * (P_mean + T) * ring_row_bytes(HV, rs) + io_bytes(B, T, HV)
            + fold_rate * fold_passes * st)


def decode_floor(B: int, HV: int, es: int) -> float:
    return 2 * state_bytes(B, HV, es) + io_bytes(B, 1, HV)


def fused_floor(B: int, T: int, HV: int, es: int, n_mean: float) -> float:
    """Two state passes + the tokens' I/O + the raw tokens cached (T) and read back (the accepted ones)."""
    token = H * K * 2 + HV * V * 2 + 2 * HV * 4
    return 2 * state_bytes(B, HV, es) + io_bytes(B, T, HV) + B * (T + n_mean) * token


def n_sets_for(st_bytes: int, set_bytes: int, l2: int) -> int:
    """Input sets to rotate over: the states' working set >= 3x L2, within ~24 GiB."""
    return max(2, min(16, -(-3 * l2 // st_bytes), (24 << 30) // max(set_bytes, 1)))


# ---------------------------------------------------------------------------------------------------------------
# Input sets and timing
# ---------------------------------------------------------------------------------------------------------------

def make_set(B, HV, sdt, Ts, dev, seed, *, lazy=True, fused_Ts=()):
    """One input set: a pool of B + 1 slots, B random distinct slots, gates, per-T token inputs and outputs, a
    LazyCache (ring dtype fp32 for an fp32 state, else bf16) and gdnjit spec caches for ``fused_Ts``."""
    g = torch.Generator(device=dev).manual_seed(seed)
    rng = random.Random(seed)
    slots = B + 1

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=g).to(bf)

    s = dict(idx=torch.tensor(rng.sample(range(slots), B), dtype=torch.int32, device=dev),
             A_log=torch.rand(HV, device=dev, generator=g), dtb=torch.randn(HV, device=dev, generator=g),
             pool=(torch.randn(slots, HV, V, K, device=dev, generator=g) * 0.05).to(sdt))
    for T in Ts:
        s[f"T{T}"] = dict(q=randn(B, T, H, K), k=randn(B, T, H, K), v=randn(B, T, HV, V), a=randn(B, T, HV),
                          b=randn(B, T, HV), out=torch.empty(B, T, HV, V, dtype=bf, device=dev))
    if lazy:
        s["cache"] = gdnjit.lazy_cache(slots, H, HV, K, V, dtype=torch.float32 if sdt == torch.float32 else bf,
                                       device=dev)
    for T in fused_Ts:
        cache = gdnjit.spec_cache(slots, H, HV, T, K, V, dtype=bf, device=dev)
        for x in cache[:4]:  # the first call replays accepted tokens already: give them defined values
            x.zero_()
        s[f"spec{T}"] = cache
    return s


def tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(x) for x in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(x) for x in obj)
    return 0


def time_loop(step, n_sets: int, steps: int, replays: int = 20, warmup: int = 3) -> float:
    """Median device microseconds per call: one CUDA graph of ``n_sets * steps`` calls, call c being
    ``step(c % n_sets, c // n_sets)`` (set, step of that set), after ``warmup`` eager calls on a side stream and one
    untimed replay; ``replays`` replays bracketed by CUDA events (bench_common.time_graph's recipe, with the step
    index a cursor trajectory needs)."""
    calls = n_sets * steps
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in range(min(warmup, calls)):
            step(c % n_sets, c // n_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for c in range(calls):
                step(c % n_sets, c // n_sets)
        graph.replay()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(replays)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        per_call = [s.elapsed_time(e) * 1e3 / calls for s, e in events]
    finally:
        try:
            graph.reset()
        except Exception:  # noqa: BLE001 (never mask the measurement's own error)
            pass
    return statistics.median(per_call)


def cuda_healthy() -> str | None:
    """None when the CUDA context still works, else why not (a sticky fault ends every later call too)."""
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:300]}"


def fold_at_for(s, T: int, pending: bool, window: int) -> tuple:
    """(fold_at, source): the committed rows at which a gdnjit lazy step of this set folds, read from the variant
    the dispatcher picks for it (the spec's `window` tunable); ``window - T + 1`` when that cannot be resolved."""
    try:
        from gdnjit.lazy import prepare_step
        from gdnjit.runner import RUNNER, choose_variant, device_info

        x = s[f"T{T}"]
        acc = torch.zeros(s["idx"].shape[0], dtype=torch.int32, device=s["idx"].device) if pending else None
        _, call = prepare_step(x["q"], x["k"], x["v"], s["A_log"], x["a"], s["dtb"], x["b"], s["pool"], s["idx"],
                               s["cache"], acc, None, True, 1.0, 20.0, -1, x["out"])
        info = device_info(call.device)
        variant = choose_variant(call.spec, dict(call.params), dict(call.facts, num_sms=info.num_sms), info.arch,
                                 RUNNER.tuned_table(call.device), batch_invariant=RUNNER.sync().batch_invariant)
        return int(variant.values["fold_at"]), f"variant (window {dict(variant.tunables).get('window')})"
    except Exception as e:  # noqa: BLE001
        return window - T + 1, f"assumed window {window} ({type(e).__name__}: {str(e)[:120]})"


# ---------------------------------------------------------------------------------------------------------------
# gdnjit columns
# ---------------------------------------------------------------------------------------------------------------

def bench_gdnjit_row(args, sd, HV, B, dev, l2, bw, add):
    """Every gdnjit column of one (state dtype, HV, B) row; ``add(record)`` takes each measurement."""
    sdt = torch.float32 if sd == "fp32" else bf
    es, rs = sdt.itemsize, sdt.itemsize
    Ts = [1] + list(args.t)
    first = make_set(B, HV, sdt, Ts, dev, seed=B, fused_Ts=args.t)
    n_sets = n_sets_for(state_bytes(B + 1, HV, es), tensor_bytes(first), l2)
    sets = [first] + [make_set(B, HV, sdt, Ts, dev, seed=1000 * i + B, fused_Ts=args.t) for i in range(1, n_sets)]
    base = dict(state=sd, HV=HV, B=B, n_sets=n_sets)

    def measure(kind, T, acc, fn, steps, floor_bytes, **extra):
        rec = dict(base, kind=kind, T=T, acc=acc, steps=steps, floor_us=round(floor_bytes / bw * 1e6, 3), **extra)
        try:
            us = time_loop(fn, n_sets, steps, replays=args.replays)
            rec.update(us=round(us, 3), frac=round(floor_bytes / bw * 1e6 / us, 3))
        except Exception as e:  # noqa: BLE001
            rec.update(us=None, frac=None, error=f"{type(e).__name__}: {str(e)[:300]}")
            bad = cuda_healthy()
            if bad:
                add(rec)
                raise RuntimeError(f"CUDA context lost after {kind} T={T} acc={acc} ({bad})") from e
        add(rec)
        return rec

    def decode(i, j):
        s = sets[i]
        x = s["T1"]
        gdnjit.gated_delta_rule_decode_pretranspose(x["q"], x["k"], x["v"], None, s["A_log"], x["a"], s["dtb"],
                                                    x["b"], output=x["out"], initial_state=s["pool"],
                                                    initial_state_indices=s["idx"])

    def reset_rings():
        for s in sets:
            s["cache"].cursor.zero_()
        torch.cuda.synchronize()

    def lazy_step(T, accs):
        def fn(i, j):
            s = sets[i]
            x = s[f"T{T}"]
            gdnjit.gated_delta_rule_lazy_step(x["q"], x["k"], x["v"], s["A_log"], x["a"], s["dtb"], x["b"],
                                              s["pool"], s["idx"], s["cache"],
                                              num_accepted=None if accs is None else accs[i][(j - 1) % len(accs[i])],
                                              output=x["out"])
        return fn

    def fused_step(T, accs):
        def fn(i, j):
            s = sets[i]
            x = s[f"T{T}"]
            gdnjit.gated_delta_rule_spec_step(x["q"], x["k"], x["v"], s["A_log"], x["a"], s["dtb"], x["b"], s["pool"],
                                              s["idx"], accs[i][j % len(accs[i])], s[f"spec{T}"], output=x["out"])
        return fn

    short = max(1, -(-10 // n_sets))  # ~10 calls a graph for the cursor-free columns
    try:
        measure("decode", 1, None, decode, short, decode_floor(B, HV, es))
        fa, src = fold_at_for(first, 1, False, args.window)
        steps = steps_for("1", fa)
        fold_rate, P_mean = traffic(*simulate(torch.zeros(steps, B, dtype=torch.int64), 1, fa, plain=True)[::2])
        floor, floor_in = (lazy_floor(B, 1, HV, es, rs, fold_rate, P_mean),
                           lazy_floor(B, 1, HV, es, rs, fold_rate, P_mean, 1.0))
        if fa <= 0:  # the eager form (window 0): the state read and written every step, no ring rows
            fold_rate, P_mean, floor = 1.0, 0.0, decode_floor(B, HV, es)
            floor_in = floor
        reset_rings()
        measure("lazy1", 1, None, lazy_step(1, None), steps, floor, fold_at=fa, fold_at_source=src,
                fold_rate=round(fold_rate, 4), P_mean=round(P_mean, 3), floor_inlaunch_us=round(floor_in / bw * 1e6, 3))
        for T in args.t:
            fa, src = fold_at_for(first, T, True, args.window)
            for label in acc_labels(T):
                steps = steps_for(label, fa)
                seq = accept_sequences(B, T, label, steps, n_sets, seed=B)
                n_steady = 1 if label != "rand" else steps
                accs = [[seq[i, j].to(device=dev, dtype=torch.int32) for j in range(n_steady)] for i in range(n_sets)]
                n_mean = float(seq.double().mean())
                measure("fused", T, label, fused_step(T, accs), steps, fused_floor(B, T, HV, es, n_mean))
                fold_rate, P_mean = traffic(*simulate(seq[0], T, fa)[::2])
                reset_rings()
                measure("lazy", T, label, lazy_step(T, accs), steps,
                        lazy_floor(B, T, HV, es, rs, fold_rate, P_mean), fold_at=fa, fold_at_source=src,
                        fold_rate=round(fold_rate, 4), P_mean=round(P_mean, 3),
                        floor_inlaunch_us=round(lazy_floor(B, T, HV, es, rs, fold_rate, P_mean, 1.0) / bw * 1e6, 3))
                del accs
        measure("copy", None, None,
                lambda i, j: torch.mul(sets[i]["pool"][:B], 1, out=sets[(i + 1) % n_sets]["pool"][:B]), short,
                2 * state_bytes(B, HV, es))
    finally:
        first = None
        sets.clear()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer u-cache (worker process)
# ---------------------------------------------------------------------------------------------------------------

def fi_set_bytes(B: int, HV: int, T: int) -> int:
    slots = B + 1
    return (state_bytes(slots, HV, 2) + slots * RING * ring_row_bytes(HV, 2) + io_bytes(B, T, HV))


def fi_import():
    """(flush function, None) or (None, why it is unavailable)."""
    for name in UCACHE_ENV:  # FlashInfer picks its dtypes at import: the bf16 module
        os.environ.pop(name, None)
    try:
        from flashinfer.gdn_kernels import gated_delta_rule_mtp_ucache_flush as fn
    except Exception as e:  # noqa: BLE001
        return None, f"import flashinfer.gdn_kernels failed: {type(e).__name__}: {str(e)[:300]}"
    if fn is not None:
        return fn, None
    try:  # flashinfer.gdn_kernels swallows the module's import error: show it
        importlib.import_module("flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush")
        why = "flashinfer.gdn_kernels.gated_delta_rule_mtp_ucache_flush is None"
    except Exception as e:  # noqa: BLE001
        why = f"flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush: {type(e).__name__}: {str(e)[:300]}"
    return None, why


def fi_worker(args) -> int:
    """Measure the FlashInfer items of a job file, one JSON line each into the log (module docstring)."""
    with open(args.fi_worker) as f:
        job = json.load(f)
    log = open(args.fi_log, "a", buffering=1)

    def emit(**kw):
        log.write(json.dumps(kw) + "\n")
        log.flush()
        os.fsync(log.fileno())

    fi, why = fi_import()
    if fi is None:
        emit(unavailable=why)
        return 0
    import flashinfer

    emit(version=getattr(flashinfer, "__version__", "?"), file=getattr(flashinfer, "__file__", "?"))
    dev = torch.device("cuda", torch.cuda.current_device())
    for cfg in job["configs"]:
        HV, B, T, n_sets = cfg["HV"], cfg["B"], cfg["T"], cfg["n_sets"]
        fmin = FI_WINDOW - T + 1
        emit(config=[HV, B, T])
        sets = []
        for i in range(n_sets):
            g = torch.Generator(device=dev).manual_seed(17 * i + B)
            slots = B + 1

            def randn(*shape, scale=1.0):
                return (torch.randn(*shape, device=dev, generator=g) * scale).to(bf)

            sets.append(dict(
                q=randn(B, T, H, K), k=randn(B, T, H, K), v=randn(B, T, HV, V), a=randn(B, T, HV), b=randn(B, T, HV),
                A_log=torch.rand(HV, device=dev, generator=g).to(bf), dtb=randn(HV),
                pool=randn(slots, HV, V, K, scale=0.05),
                idx=torch.randperm(slots, device=dev, generator=g)[:B].to(torch.int32),
                out=torch.empty(B, T, HV, V, dtype=bf, device=dev),
                kc=torch.zeros(slots, H, RING, K, dtype=bf, device=dev),
                uc=torch.zeros(slots, HV, RING, V, dtype=bf, device=dev),
                gc=torch.zeros(slots, HV, RING, dtype=torch.float32, device=dev)))

        def call(s, hl, cb):
            fi(s["A_log"], s["a"], s["dtb"], q=s["q"], k=s["k"], v=s["v"], b=s["b"], initial_state_source=s["pool"],
               initial_state_indices=s["idx"], k_cache=s["kc"], u_cache=s["uc"], g_cache=s["gc"], hist_len=hl,
               cache_base=cb, output=s["out"], flush_min=fmin, restart_hist_on_flush=False)

        for item in cfg["items"]:
            key = [HV, B, T, item]
            emit(start=key)
            try:
                if item in ("P0", "fold"):
                    hl = torch.full((B,), 0 if item == "P0" else fmin, dtype=torch.int32, device=dev)
                    cb = torch.zeros(B, dtype=torch.int32, device=dev)
                    steps = max(1, -(-10 // n_sets))
                    us = time_loop(lambda i, j: call(sets[i], hl, cb), n_sets, steps, replays=job["replays"])
                    emit(done=key, us=us, steps=steps, fold_at=fmin)
                else:
                    steps = steps_for(item, fmin)
                    seq = accept_sequences(B, T, item, steps, n_sets, seed=B)
                    traj = []
                    for i in range(n_sets):
                        P, base, fold = simulate(seq[i], T, fmin)
                        traj.append([(P[j].to(device=dev, dtype=torch.int32),
                                      base[j].to(device=dev, dtype=torch.int32)) for j in range(steps)])
                    fold_rate, P_mean = traffic(*simulate(seq[0], T, fmin)[::2])
                    us = time_loop(lambda i, j: call(sets[i], *traj[i][j]), n_sets, steps, replays=job["replays"])
                    emit(done=key, us=us, steps=steps, fold_at=fmin, fold_rate=fold_rate, P_mean=P_mean)
            except Exception as e:  # noqa: BLE001
                emit(error=key, msg=f"{type(e).__name__}: {str(e)[:400]}",
                     where=traceback.format_exc(limit=3)[-600:])
                bad = cuda_healthy()
                if bad:
                    emit(fatal=key, msg=bad)
                    return 3
        sets.clear()
        torch.cuda.empty_cache()
    emit(finished=True)
    return 0


def run_fi(args, configs, deadline, say) -> tuple:
    """Run the FlashInfer items of ``configs`` in worker processes, a fresh one after each crash; returns
    ``(results {(HV, B, T, item): dict}, unavailable reason or None, info)``."""
    pending = [dict(c, items=list(c["items"])) for c in configs]
    results, info = {}, {}
    tmp = tempfile.mkdtemp(prefix="bench_lazy_fi_")
    attempt = 0
    while any(c["items"] for c in pending):
        attempt += 1
        job_path = os.path.join(tmp, f"job{attempt}.json")
        log_path = os.path.join(tmp, f"log{attempt}.jsonl")
        with open(job_path, "w") as f:
            json.dump(dict(configs=[c for c in pending if c["items"]], replays=args.replays), f)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < 5:
            say("FI: time budget spent; the remaining FlashInfer cases are not measured")
            break
        cmd = [sys.executable, os.path.abspath(__file__), "--fi-worker", job_path, "--fi-log", log_path]
        try:  # no budget: an hour at most (a hung worker must not hold the run forever)
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600 if left is None else left)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired as e:
            rc, tail = "timeout", ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
                                   else (e.stdout or ""))[-1500:]
        lines = []
        if os.path.exists(log_path):
            with open(log_path) as f:
                for ln in f:
                    try:
                        lines.append(json.loads(ln))
                    except json.JSONDecodeError:
                        pass  # a line cut by the crash
        started, config_started, progressed = None, None, False
        imported = any("version" in ev for ev in lines)
        fatal = any("fatal" in ev for ev in lines)
        for ev in lines:
            if "unavailable" in ev:
                return results, ev["unavailable"], info
            if "version" in ev:
                info = dict(version=ev["version"], file=ev["file"])
            if "config" in ev:
                config_started, started = tuple(ev["config"]), None
            if "start" in ev:
                started = tuple(ev["start"])
            for kind in ("done", "error"):
                if kind in ev:
                    key = tuple(ev[kind])
                    results[key] = dict(ev, status=kind)
                    progressed = True
                    started = None
                    for c in pending:
                        if (c["HV"], c["B"], c["T"]) == key[:3] and key[3] in c["items"]:
                            c["items"].remove(key[3])
        if rc == 0:
            break
        why = f"worker exit {rc}: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
        if not imported:  # died importing FlashInfer (or starting CUDA): every case would
            return results, f"the FlashInfer worker died before its first case ({why})", info
        if fatal:  # a case raised and left the CUDA context unusable: recorded; a fresh worker goes on
            continue
        if rc == "timeout" and left is not None:
            say(f"FI: time budget spent (in {started or config_started}); the remaining FlashInfer cases are not "
                "measured")
            break
        # the worker died in a case (a fault, a signal, the timeout): blame that case, go on with a fresh one
        victim = []
        if started is not None:
            victim = [started]
        elif config_started is not None:  # died building the inputs: the whole config
            victim = [config_started + (it,) for c in pending if (c["HV"], c["B"], c["T"]) == config_started
                      for it in c["items"]]
        elif not progressed:
            c = next(c for c in pending if c["items"])
            victim = [(c["HV"], c["B"], c["T"], it) for it in c["items"]]
        for key in victim:
            results[key] = dict(status="crash", msg=why, tail=tail[-800:])
            for c in pending:
                if (c["HV"], c["B"], c["T"]) == key[:3] and key[3] in c["items"]:
                    c["items"].remove(key[3])
            say(f"FI crash: HV={key[0]} B={key[1]} T={key[2]} {key[3]}: {why}")
    return results, None, info


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------

def fmt(x, spec="8.1f"):
    return "-" if x is None else format(x, spec)


def tables(records, meta) -> str:
    by = {}
    for r in records:
        by[(r["state"], r["HV"], r["B"], r["kind"], r.get("T"), r.get("acc"))] = r
    rows = sorted({(r["state"], r["HV"], r["B"]) for r in records}, key=lambda k: (k[0] != "bf16", k[1], k[2]))
    bw = meta["copy_bw"]
    out = [f"Plain decoding (T = 1), microseconds per token; floors at {bw / 1e12:.2f} TB/s (read + write counted)"]
    head = ["state", "HV", "B", "read fl", "r+w fl", "lazy fl", "copy", "decode", "lazy T=1", "lazy/dec",
            "frac lazy", "frac dec"]
    body = []
    for sd, HV, B in rows:
        es = 4 if sd == "fp32" else 2
        lz, dc, cp = (by.get((sd, HV, B, k, T, None)) for k, T in (("lazy1", 1), ("decode", 1), ("copy", None)))
        if not (lz or dc or cp):
            continue
        us = lambda r: None if r is None else r.get("us")  # noqa: E731
        ratio = us(lz) / us(dc) if us(lz) and us(dc) else None
        body.append([sd, HV, B, fmt(state_bytes(B, HV, es) / bw * 1e6), fmt(2 * state_bytes(B, HV, es) / bw * 1e6),
                     fmt(lz and lz["floor_us"]), fmt(us(cp)), fmt(us(dc)), fmt(us(lz)), fmt(ratio, "6.2f"),
                     fmt(lz and lz.get("frac"), "5.2f"), fmt(dc and dc.get("frac"), "5.2f")])
    out.append(bc.format_table(head, body) if body else "(no rows)")
    out.append("")
    out.append("Speculative decoding, microseconds per step (T drafts); acc: accepted drafts a step (rand: uniform 1..T)")
    head = ["state", "HV", "B", "T", "acc", "folds/st", "lazy fl", "fused", "lazy", "FI", "lazy/FI", "lazy/fused",
            "frac lazy", "frac FI"]
    body = []
    for sd, HV, B in rows:
        Ts = sorted({r["T"] for r in records if (r["state"], r["HV"], r["B"]) == (sd, HV, B)
                     and r["kind"] in ("lazy", "fused", "fi") and r.get("T")})
        for T in Ts:
            for label in acc_labels(T):
                fu, lz, fi = (by.get((sd, HV, B, k, T, label)) for k in ("fused", "lazy", "fi"))
                if not (fu or lz or fi):
                    continue
                us = lambda r: None if r is None else r.get("us")  # noqa: E731
                fi_cell = fmt(us(fi)) if fi is None or us(fi) is not None else ("FI " + fi.get("status", "error"))
                body.append([sd, HV, B, T, label, fmt((lz or fi or {}).get("fold_rate"), "7.3f"),
                             fmt((lz or fi or {}).get("floor_us")), fmt(us(fu)), fmt(us(lz)), fi_cell,
                             fmt(us(lz) / us(fi) if us(lz) and us(fi) else None, "6.2f"),
                             fmt(us(lz) / us(fu) if us(lz) and us(fu) else None, "6.2f"),
                             fmt(lz and lz.get("frac"), "5.2f"), fmt(fi and fi.get("frac"), "5.2f")])
    out.append(bc.format_table(head, body) if body else "(no rows)")
    errs = [r for r in records if r.get("error") or r.get("status") in ("error", "crash")]
    if errs:
        out += ["", "Errors:"]
        out += [f"  {r['kind']} {r['state']} HV={r['HV']} B={r['B']} T={r.get('T')} acc={r.get('acc')}: "
                f"{r.get('error') or r.get('msg')}" for r in errs]
    if meta.get("fi_unavailable"):
        out += ["", f"FlashInfer u-cache unavailable: {meta['fi_unavailable']}"]
    return "\n".join(out)


def write_out(out_dir, meta, records):
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "lazy.json"), "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1, default=str)
    with open(os.path.join(out_dir, "lazy.md"), "w") as f:
        f.write("# bench_lazy\n\n```\n" + tables(records, meta) + "\n```\n")


# ---------------------------------------------------------------------------------------------------------------
# Dry run and main
# ---------------------------------------------------------------------------------------------------------------

def dry_run(args) -> int:
    """No GPU: one small input set on the CPU, then the planned rows with fold rates and floors (assumed window)."""
    sd, HV, B = args.state[0], min(args.hv), min(args.b)
    sdt = torch.float32 if sd == "fp32" else bf
    s = make_set(B, HV, sdt, [1] + list(args.t), torch.device("cpu"), seed=B, fused_Ts=args.t)
    print(f"input set {sd} HV={HV} B={B}: {tensor_bytes(s) / 2**20:.1f} MiB, "
          f"n_sets with a {DRY_RUN_L2 >> 20} MiB L2: "
          f"{n_sets_for(state_bytes(B + 1, HV, sdt.itemsize), tensor_bytes(s), DRY_RUN_L2)}")
    for name, val in s.items():
        if isinstance(val, dict):
            val = {f"{name}.{k}": x for k, x in val.items()}
        elif isinstance(val, tuple):
            val = {f"{name}.{type(val)._fields[i]}": x for i, x in enumerate(val)}
        else:
            val = {name: val}
        for label, x in val.items():
            print(f"  {label:14s} {str(tuple(x.shape)):26s} {str(x.dtype)[6:]}")
    bw = 4.0e12
    print(f"floors at an assumed {bw / 1e12:.1f} TB/s, window {args.window} (fold_at = window - T + 1)")
    print(f"{'state':5s} {'HV':>3s} {'B':>4s} {'T':>2s} {'acc':>4s} {'steps':>5s} {'folds/st':>8s} {'P mean':>6s} "
          f"{'lazy fl':>8s} {'fused fl':>8s} {'dec fl':>7s}  FI hist_len (row 0, first 16 steps)")
    for sd in args.state:
        es = 4 if sd == "fp32" else 2
        for HV in args.hv:
            for B in args.b:
                fa = args.window
                steps = steps_for("1", fa)
                fr, pm = traffic(*simulate(torch.zeros(steps, B, dtype=torch.int64), 1, fa, plain=True)[::2])
                print(f"{sd:5s} {HV:3d} {B:4d} {1:2d} {'-':>4s} {steps:5d} {fr:8.4f} {pm:6.2f} "
                      f"{lazy_floor(B, 1, HV, es, es, fr, pm) / bw * 1e6:8.1f} {'-':>8s} "
                      f"{decode_floor(B, HV, es) / bw * 1e6:7.1f}")
                for T in args.t:
                    fa = args.window - T + 1
                    for label in acc_labels(T):
                        steps = steps_for(label, fa)
                        seq = accept_sequences(B, T, label, steps, 1, seed=B)
                        P, base, fold = simulate(seq[0], T, fa)
                        fr, pm = traffic(P, fold)
                        traj = ""
                        if sd == "bf16" and T in (4, 8):
                            Pf, _, ff = simulate(seq[0], T, FI_WINDOW - T + 1)
                            traj = " ".join(f"{int(p)}{'F' if f else ''}" for p, f in zip(Pf[:16, 0], ff[:16, 0]))
                        print(f"{sd:5s} {HV:3d} {B:4d} {T:2d} {label:>4s} {steps:5d} {fr:8.4f} {pm:6.2f} "
                              f"{lazy_floor(B, T, HV, es, es, fr, pm) / bw * 1e6:8.1f} "
                              f"{fused_floor(B, T, HV, es, float(seq.double().mean())) / bw * 1e6:8.1f} "
                              f"{'-':>7s}  {traj}")
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, nargs="+", default=[1, 8, 32, 64, 128, 512])
    ap.add_argument("--hv", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--t", type=int, nargs="*", default=[4, 8],
                    help="draft tokens of the speculative columns (none: only decode, lazy1 and copy)")
    ap.add_argument("--state", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    ap.add_argument("--quick", action="store_true", help="B 1 64 512, HV 64, T 4")
    ap.add_argument("--no-fi", action="store_true", help="skip FlashInfer's u-cache")
    ap.add_argument("--fi-only", action="store_true", help="only FlashInfer's u-cache (and the floors)")
    ap.add_argument("--window", type=int, default=16,
                    help="gdnjit's lazy window, used only where the dispatcher's choice cannot be read")
    ap.add_argument("--force", default=None, metavar="JSON",
                    help="gdn_lazy tunables forced on every lazy step, e.g. '{\"form\": \"tile\", \"tile_v\": 64, "
                         "\"lanes_per_row\": 8, \"rows_per_lane\": 1}' (the other columns keep their choices)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=0, help="start no new row after this many seconds (0: none)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: one CPU input set, the planned rows and floors")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default $OUT)")
    ap.add_argument("--fi-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fi-log", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.b, args.hv, args.t = [1, 64, 512], [64], [4]
    if any(not 1 <= T <= 16 for T in args.t):
        ap.error("--t: draft tokens must be in 1..16")
    if any(HV % H for HV in args.hv):
        ap.error(f"--hv: value heads must be multiples of H={H}")
    if args.force is not None:
        try:
            args.force = bc.parse_force(args.force, "gdn_lazy")
        except ValueError as e:
            ap.error(f"--force: {e}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.fi_worker:
        return fi_worker(args)
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("bench_lazy: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    if args.force:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
        from test_lazy_gpu import forcing

        with forcing(args.force):
            return run(args)
    return run(args)


def run(args) -> int:
    """Every row the arguments ask for (module docstring)."""
    t0 = time.monotonic()
    deadline = t0 + args.budget_s if args.budget_s > 0 else None
    dev = torch.device("cuda", torch.cuda.current_device())
    bws = bc.copy_bandwidths(dev)
    bw = max(bws.values())
    l2 = bc.l2_bytes(dev)
    meta = dict(env=bc.env_info(dev), copy_bw=bw, copy_bws=bws, l2=l2, H=H, K=K, V=V, args=vars(args),
                window_default=args.window)
    records = []
    print(f"{torch.cuda.get_device_name(dev)}, copy bandwidth {bw / 1e12:.2f} TB/s "
          f"(memcpy {bws['memcpy'] / 1e12:.2f}, kernel {bws['kernel'] / 1e12:.2f}), L2 {l2 >> 20} MiB", flush=True)

    def add(rec):
        records.append(rec)
        cells = " ".join(f"{k}={rec[k]}" for k in ("state", "HV", "B", "kind", "T", "acc", "us", "floor_us", "frac")
                         if rec.get(k) is not None)
        print(cells + (f" ERROR {rec['error']}" if rec.get("error") else ""), flush=True)

    def say(msg):
        meta.setdefault("notes", []).append(msg)
        print(msg, flush=True)

    stopped = False
    if not args.fi_only:
        for sd in args.state:
            for HV in args.hv:
                for B in args.b:
                    if deadline is not None and time.monotonic() > deadline:
                        if not stopped:
                            say(f"budget of {args.budget_s:.0f} s reached: rows from {sd} HV={HV} B={B} on not run")
                        stopped = True
                        continue
                    try:
                        bench_gdnjit_row(args, sd, HV, B, dev, l2, bw, add)
                    except Exception as e:  # noqa: BLE001 (a row that cannot run: say why, go on if CUDA can)
                        say(f"row {sd} HV={HV} B={B} failed: {type(e).__name__}: {str(e)[:300]}")
                        bad = cuda_healthy()
                        if bad:
                            say(f"stopping: the CUDA context is unusable ({bad})")
                            write_out(args.out, meta, records)
                            print(tables(records, meta))
                            return 1
                        torch.cuda.empty_cache()
                    write_out(args.out, meta, records)
    fi_Ts = [T for T in args.t if T in (4, 8)]
    if args.no_fi:
        say("FlashInfer u-cache: skipped (--no-fi)")
    elif "bf16" not in args.state or not fi_Ts:
        say("FlashInfer u-cache: no row it runs (bf16 state, T 4 or 8)")
    else:
        torch.cuda.empty_cache()
        configs = []
        for HV in args.hv:
            for T in fi_Ts:
                for B in args.b:
                    configs.append(dict(HV=HV, B=B, T=T, items=["P0", "fold"] + acc_labels(T),
                                        n_sets=n_sets_for(state_bytes(B + 1, HV, 2), fi_set_bytes(B, HV, T), l2)))
        results, why, info = run_fi(args, configs, deadline, say)
        meta["flashinfer"] = info
        if why:
            meta["fi_unavailable"] = why
            say(f"FlashInfer u-cache unavailable: {why}")
        for cfg in configs:
            HV, B, T = cfg["HV"], cfg["B"], cfg["T"]
            stat = {it: results.get((HV, B, T, it), {}) for it in ("P0", "fold")}
            for label in acc_labels(T):
                res = results.get((HV, B, T, label))
                if res is None:
                    continue
                rec = dict(kind="fi", state="bf16", HV=HV, B=B, T=T, acc=label, n_sets=cfg["n_sets"],
                           status=res["status"], us=None, frac=None,
                           fi_P0_us=stat["P0"].get("us"), fi_fold_us=stat["fold"].get("us"))
                if res["status"] == "done":
                    fl = lazy_floor(B, T, HV, 2, 2, res["fold_rate"], res["P_mean"])
                    rec.update(us=round(res["us"], 3), steps=res["steps"], fold_at=res["fold_at"],
                               fold_rate=round(res["fold_rate"], 4), P_mean=round(res["P_mean"], 3),
                               floor_us=round(fl / bw * 1e6, 3), frac=round(fl / bw * 1e6 / res["us"], 3),
                               floor_inlaunch_us=round(lazy_floor(B, T, HV, 2, 2, res["fold_rate"], res["P_mean"],
                                                                  1.0) / bw * 1e6, 3))
                else:
                    rec["msg"] = res.get("msg")
                add(rec)
            for it in ("P0", "fold"):
                res = stat[it]
                if res.get("status") in ("error", "crash"):
                    say(f"FI {res['status']} at the stationary point {it}: HV={HV} B={B} T={T}: {res.get('msg')}")
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    write_out(args.out, meta, records)
    print()
    print(tables(records, meta))
    if args.out:
        print(f"\nwrote {os.path.join(args.out, 'lazy.json')} and lazy.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
