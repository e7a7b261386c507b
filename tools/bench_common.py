"""Shared helpers for the gdnjit benchmark scripts (tools/bench_*.py).

Nothing here is GDN specific, so later benchmarks (e.g. NVFP4) can reuse it:

* ``copy_bandwidth(device)``   achievable DRAM bandwidth (bytes/s) of a large
                               device-to-device copy, counting read + write
                               (``copy_bandwidths``: both ways it is measured).
* ``time_graph(fn, n_sets)``   device time per call, from CUDA-graph replays,
                               rotating through ``n_sets`` input sets.
* ``time_eager(fn, n_sets)``   per-call host wall time of back-to-back eager
                               calls (see its docstring for exactly what).
* ``time_events(fn)``          event-timed single eager calls (long calls).
* ``l2_bytes(device)``         L2 cache size in bytes.
* ``env_info(device)``         device / library versions for result headers.
* ``parse_force(text, spec)``  a ``--force`` JSON object of a spec's tunables, checked.
* ``format_table`` / ``write_results``: plain-text table, results.json and
                               results.md.

Callables passed to the timers take one integer ``i`` (0 <= i < n_sets) that
selects which pre-allocated input set to use, so consecutive calls touch
different memory and a working set larger than L2 can be measured.

Import from a script in tools/ with ``sys.path.insert(0, os.path.dirname(__file__))``.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import time
from typing import Callable, Sequence

import torch

__all__ = [
    "copy_bandwidth",
    "copy_bandwidths",
    "time_events",
    "time_graph",
    "time_eager",
    "l2_bytes",
    "env_info",
    "format_table",
    "write_results",
]


def _as_indexed(fn_or_list, n_sets: int) -> tuple[Callable[[int], object], int]:
    """Normalize ``fn(i)`` / ``[fn0, fn1, ...]`` to ``(fn(i), n_sets)``."""
    if isinstance(fn_or_list, (list, tuple)):
        fns = list(fn_or_list)
        if not fns:
            raise ValueError("empty callable list")
        return (lambda i: fns[i]()), len(fns)
    if n_sets < 1:
        raise ValueError(f"n_sets must be >= 1, got {n_sets}")
    return fn_or_list, n_sets


def l2_bytes(device) -> int:
    """L2 cache size of ``device`` in bytes."""
    return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)


def time_graph(
    fn,
    n_sets: int = 1,
    calls: int = 10,
    replays: int = 50,
    warmup: int = 3,
) -> float:
    """Median device time per call (µs), measured by replaying a CUDA graph.

    ``fn`` is either a callable ``fn(i)`` where ``i`` in ``[0, n_sets)`` picks
    the input set, or a list of zero-argument callables (one per set; then
    ``n_sets`` is the list length).

    Procedure (the recipe from the torch CUDA-graph docs):

    1. ``warmup`` eager calls on a side stream (JIT compilation, allocator
       warm-up, cuBLAS/Triton handle creation stay out of the capture).
    2. Capture ``calls`` calls into one graph, cycling ``i = j % n_sets``.
       ``calls`` is raised to ``max(calls, n_sets)`` and rounded up to a
       multiple of ``n_sets``, so every set is used once per rotation and the
       last call of a replay and the first call of the next one use different
       sets as well.
    3. One untimed replay, then ``replays`` replays each bracketed by CUDA
       events; result = median(replay time) / calls.

    Whatever ``fn`` returns is kept alive in a ring of the last ``n_sets``
    results while warming up and capturing.  Outputs that ``fn`` allocates
    itself (e.g. a peer library returning fresh tensors) therefore also rotate
    through ``n_sets`` distinct blocks of the graph's private memory pool,
    like the inputs do, instead of all landing in one L2-resident block.

    Caveat: a ``Tensor.copy_`` inside ``fn`` is captured as a memcpy node that
    runs on a copy engine, slower than the eager (or SM kernel) copy.
    """
    fn, n_sets = _as_indexed(fn, n_sets)
    calls = n_sets * math.ceil(max(calls, n_sets) / n_sets)
    ring: collections.deque = collections.deque(maxlen=n_sets)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for j in range(warmup):
            ring.append(fn(j % n_sets))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    ring.clear()

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for j in range(calls):
                ring.append(fn(j % n_sets))
        ring.clear()

        graph.replay()
        torch.cuda.synchronize()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(replays)
        ]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        per_call_us = [s.elapsed_time(e) * 1e3 / calls for s, e in events]
    finally:
        ring.clear()
        with contextlib.suppress(Exception):  # don't mask a capture error
            graph.reset()
    return statistics.median(per_call_us)


def time_eager(
    fn,
    n_sets: int = 1,
    iters: int = 20,
    bursts: int = 7,
    warmup: int = 3,
    include_sync: bool = True,
) -> float:
    """Median per-call host wall time (µs) of ``iters`` back-to-back eager calls.

    ``fn`` / ``n_sets`` as in :func:`time_graph`; calls cycle through the sets
    and return values are kept in the same ring of ``n_sets`` results.
    After ``warmup`` untimed calls, each of ``bursts`` bursts does::

        torch.cuda.synchronize()          # device idle, queue empty
        t0 = time.perf_counter()
        for j in range(iters): fn(next set)
        [torch.cuda.synchronize()]        # only if include_sync
        t1 = time.perf_counter()

    and yields ``(t1 - t0) / iters``; the median over bursts is returned.
    The garbage collector is disabled during the bursts.

    * ``include_sync=True`` (the "eager" number): the steady-state cost per
      call of an eager loop, i.e. roughly ``max(host launch cost, device time)``
      plus one synchronization latency amortized over ``iters`` calls.  This
      is what a caller without CUDA graphs pays per call.
    * ``include_sync=False`` (the "host" number): mean time for the host to
      *enqueue* one call (Python wrapper, argument checks, allocations, kernel
      launch API), independent of device time as long as the launch queue
      does not fill up, which ``iters`` of a few dozen single-kernel calls
      does not.
    """
    fn, n_sets = _as_indexed(fn, n_sets)
    ring: collections.deque = collections.deque(maxlen=n_sets)  # as in time_graph
    for j in range(warmup):
        ring.append(fn(j % n_sets))
    j = 0
    per_call_us = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: no collector pauses inside a burst
    try:
        for _ in range(bursts):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                ring.append(fn(j % n_sets))
                j += 1
            if include_sync:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            per_call_us.append((t1 - t0) * 1e6 / iters)
    finally:
        if gc_was_enabled:
            gc.enable()
    torch.cuda.synchronize()
    ring.clear()
    return statistics.median(per_call_us)


def time_events(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median device time (µs) of single eager calls of ``fn()``, each bracketed
    by CUDA events and synchronized; for calls long enough (>~50 µs) that
    launch gaps do not matter."""
    for _ in range(warmup):
        fn()
    per_call_us = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        per_call_us.append(start.elapsed_time(end) * 1e3)
    return statistics.median(per_call_us)


def copy_bandwidths(device, nbytes: int = 2**30, reps: int = 20) -> dict:
    """Bytes/s (read + write counted) of an ``nbytes`` device-to-device copy,
    two ways (``nbytes`` is clamped to a third of free memory):

    * ``memcpy``: eager ``dst.copy_(src)`` (cudaMemcpyAsync), event-timed.
    * ``kernel``: graph replays (:func:`time_graph`) of an SM copy kernel
      (``torch.mul(src, 1, out=dst)``).  Not ``copy_`` here: captured into a
      graph, ``copy_`` becomes a memcpy node that runs on a copy engine,
      measured at only ~2.7 TB/s on an H200 against ~4.1-4.2 TB/s otherwise.
    """
    device = torch.device(device)
    with torch.cuda.device(device):
        free, _ = torch.cuda.mem_get_info()
        n = min(nbytes, free // 3) // 4
        src = torch.rand(n, dtype=torch.float32, device=device)  # random, not zeros
        dst = torch.empty_like(src)
        us = {
            "memcpy": time_events(lambda: dst.copy_(src), reps=reps),
            "kernel": time_graph(lambda i: torch.mul(src, 1.0, out=dst), n_sets=1,
                                 calls=10, replays=reps),
        }
        del src, dst
        torch.cuda.empty_cache()
    return {k: 2 * n * 4 / (t * 1e-6) for k, t in us.items()}


def copy_bandwidth(device, nbytes: int = 2**30, reps: int = 20) -> float:
    """Achievable copy bandwidth in bytes/s (read + write counted): the larger
    of the two measurements of :func:`copy_bandwidths` (median over ``reps``)."""
    return max(copy_bandwidths(device, nbytes, reps).values())


def _git_rev() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def parse_force(text: str, spec_name: str) -> dict:
    """A ``--force`` option's JSON as a dict of the spec's tunables with allowed values; ValueError naming what is
    wrong otherwise."""
    from gdnjit.spec import get_spec

    tunables = dict(get_spec(spec_name).tunables)
    try:
        force = json.loads(text)
    except json.JSONDecodeError:
        force = None
    if not isinstance(force, dict) or not force:
        raise ValueError(f"expected a JSON object of {spec_name} tunables, got {text!r}")
    for name, value in force.items():
        if name not in tunables:
            raise ValueError(f"{name!r} is not a {spec_name} tunable (expected one of {', '.join(tunables)})")
        if value not in tunables[name] or type(value) is not type(tunables[name][0]):
            raise ValueError(f"{name}: expected one of {json.dumps(list(tunables[name]))}, got {json.dumps(value)}")
    return force


def env_info(device=None) -> dict:
    """Versions and device facts for a results header (works without a GPU)."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "git_rev": _git_rev(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if device is not None and torch.cuda.is_available():
        prop = torch.cuda.get_device_properties(torch.device(device))
        info.update(
            device=prop.name,
            sm_count=prop.multi_processor_count,
            capability=f"{prop.major}.{prop.minor}",
            memory_gib=round(prop.total_memory / 2**30, 1),
            l2_bytes=int(prop.L2_cache_size),
        )
    return info


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Right-aligned plain-text table; cells are str()-ed (None -> '-')."""
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("-" if c is None else str(c)).replace("|", "\\|") for c in r] for r in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(out)


def write_results(
    out_dir: str,
    meta: dict,
    records: list[dict],
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    title: str = "Benchmark results",
    notes: Sequence[str] = (),
) -> tuple[str, str]:
    """Write ``results.json`` (meta + full records) and ``results.md``
    (meta as a bullet list, the table, notes) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "results.json")
    md_path = os.path.join(out_dir, "results.md")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "notes": list(notes), "records": records}, f, indent=1, default=str)
    lines = [f"# {title}", ""]
    lines += [f"- **{k}**: {v}" for k, v in meta.items() if not isinstance(v, (dict, list))]
    lines += ["", _markdown_table(headers, rows), ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    return json_path, md_path
