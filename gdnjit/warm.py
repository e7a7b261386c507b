"""Precompilation: the variants the dispatcher can select for a shapes file, compiled into the cache.

Runs without a GPU: the arch comes from ``--arch`` (or the local GPU) and the SM counts the
rules may read from a table of known parts for that arch (or ``--num-sms``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Callable, Iterable, Sequence

from . import dispatch
from .cache import DiskCache
from .config import Config
from .errors import CompileError
from .plan_record import Recorded
from .shapes import Problem, iter_facts, params_for
from .spec import get_spec
from .variant import Variant

# SM counts of the parts of each arch (the rules may depend on num_sms): H100 SXM/H200, H100 PCIe, H20;
# B200; B300; RTX PRO 6000 / RTX 5090.
KNOWN_SM_COUNTS = {90: (132, 114, 78), 100: (148,), 103: (148,), 120: (188, 170)}


def _targets(number: int) -> tuple[str, ...]:
    # NVRTC's names for one arch: the portable target, the arch-specific one ('a'), and from Blackwell
    # (sm_100) on the family target ('f'); compile.check_arch's grammar, restricted to real targets
    return (f"sm_{number}", f"sm_{number}a", *((f"sm_{number}f",) if number >= 100 else ()))


# The targets the command line compiles for (warm, tune, render, spec show): those of the archs above,
# the one table of supported GPUs (the runtime uses sm_90 on Hopper and sm_<N>a from Blackwell on).
SUPPORTED_ARCHS: tuple[str, ...] = tuple(t for number in sorted(KNOWN_SM_COUNTS) for t in _targets(number))


def check_supported_arch(arch: str, what: str | None = "--arch") -> str:
    """``arch`` if it is one of :data:`SUPPORTED_ARCHS`, else ValueError naming ``what`` (the option or
    source; None: no prefix), the supported targets and ``arch`` (checked before anything is planned
    or compiled: an unsupported target would only show up as one NVRTC failure per variant)."""
    if arch not in SUPPORTED_ARCHS:
        prefix = f"{what}: " if what else ""
        raise ValueError(f"{prefix}expected one of {', '.join(SUPPORTED_ARCHS)}, got {arch!r}")
    return arch


def sm_counts_for(arch: str) -> tuple[int, ...]:
    from .compile import check_arch

    number, _ = check_arch(arch)
    if number not in KNOWN_SM_COUNTS:
        raise ValueError(f"arch: no known SM counts for {arch}; pass --num-sms")
    return KNOWN_SM_COUNTS[number]


def plan(problems: Iterable[Problem], archs: Sequence[str], num_sms: Sequence[int] | None = None,
         tuned: Sequence[dict] = (), batch_invariant: bool = False) -> list[Variant]:
    """Every distinct variant the dispatcher selects for the problems, archs and SM counts, in order;
    with ``tuned`` table documents, also each table's choice for tables of the same arch;
    ``batch_invariant``: the choices of batch-invariant mode (``GDNJIT_BATCH_INVARIANT``)."""
    from .tuned import TunedTable

    seen: dict[tuple, Variant] = {}
    # models and degrees that give a call the same heads are one problem to the dispatcher: plan each once
    problems = list({(p.spec, p.params, p.facts, p.batch_fact, p.batch_sizes): p for p in problems}.values())
    for arch in archs:
        tables = [TunedTable(doc.get("entries", [])) for doc in tuned if doc.get("arch") == arch]
        counts = tuple(num_sms) if num_sms else sm_counts_for(arch)
        for prob in problems:
            spec = get_spec(prob.spec)
            params = params_for(prob, arch)
            live = [t for t in tables if t.covers(spec.name, params, dict(prob.facts))]  # most problems: none
            # one select_each for every SM count: the rules' conjuncts that read no fact are evaluated once
            all_facts = [facts for sms in counts for facts in iter_facts(prob, sms)]
            ruled = dispatch.select_each(spec, params, [{f: facts[f] for f in spec.facts} for facts in all_facts],
                                         batch_invariant=batch_invariant)
            for facts, chosen in zip(all_facts, ruled):
                choices = [chosen[0]]
                for table in live:
                    t = table.lookup(spec.name, params, facts, batch_invariant)
                    if t is not None and spec.valid(params, t):  # as dispatch.select takes it
                        seen_facts = spec.dispatch_facts({f: facts[f] for f in spec.facts}, batch_invariant)
                        choices.append(dispatch.retiled(spec, params, dict(t), seen_facts))
                for tunables in choices:
                    # sorted: a rule's tunables come in spec order, a tuned table's in JSON key order
                    memo = (spec.name, tuple(params.items()), tuple(sorted(tunables.items())), arch)
                    if memo not in seen:
                        seen[memo] = Variant.make(spec, params, tunables, arch)
                    # the launch it makes first, per facts: its own choice may differ by batch (a prep's head warps)
                    first = first_launch_variant(spec, params, tunables, facts, arch, live, batch_invariant)
                    if first is not None:
                        seen.setdefault((spec.name, first.params, tuple(sorted(first.tunables)), arch), first)
    return list(seen.values())


def first_launch_variant(spec, params: dict, tunables: dict, facts: dict, arch: str, tables: Sequence = (),
                         batch_invariant: bool = False) -> Variant | None:
    """The variant of the launch a call of ``params`` / ``tunables`` makes before its own (the spec's
    ``first_launch``: the lazy rows form's prep), as the runner resolves it: the dispatcher's choice for its params
    (the first of ``tables`` with an entry, else the rules) with the pinned tunables over it; None when the call is
    one launch (or the pinned choice is not valid: the call itself would then be refused)."""
    first = spec.first_launch_of(params, tunables)
    if first is None:
        return None
    fparams, pinned = first
    sfacts = {f: facts[f] for f in spec.facts}
    choice = next((t for t in (table.lookup(spec.name, fparams, facts, batch_invariant) for table in tables)
                   if t is not None), None)
    chosen, _ = dispatch.select(spec, fparams, sfacts, tuned=choice, batch_invariant=batch_invariant)
    chosen = dict(chosen, **pinned)
    return Variant.make(spec, fparams, chosen, arch) if spec.valid(fparams, chosen) else None


@dataclasses.dataclass
class WarmResult:
    name: str  # the variant's cache entry name
    description: str  # Variant.describe()
    status: str  # "cached", "compiled" or "failed"
    seconds: float
    meta: dict
    error: str = ""


def _result(variant: Variant, status: str, seconds: float, meta: dict, error: str = "") -> WarmResult:
    return WarmResult(variant.name, variant.describe(), status, seconds, meta, error)


def _warm_one(variant: Variant, config: Config) -> WarmResult:
    cache = DiskCache(config)
    t0 = time.perf_counter()
    hit = None if config.always_compile else cache.lookup(variant.name, variant.key)
    if hit is not None:
        return _result(variant, "cached", time.perf_counter() - t0, hit.meta)
    try:
        entry = cache.get_or_build(variant.name, variant.key_fields, variant.build)
    except CompileError as e:
        return _result(variant, "failed", time.perf_counter() - t0, {}, e.dump())
    status = "compiled" if entry.origin == "built" else "cached"
    return _result(variant, status, time.perf_counter() - t0, entry.meta)


def all_cached(recorded: Sequence[Recorded], config: Config) -> list[WarmResult] | None:
    """A "cached" result for each variant of a recorded plan (:mod:`gdnjit.plan_record`) when every one is a
    valid cache entry, else None (the caller plans and warms: nothing here compiles)."""
    if config.always_compile:
        return None
    cache = DiskCache(config)
    results = []
    for r in recorded:
        hit = cache.lookup(r.name, r.key)
        if hit is None:
            return None
        results.append(WarmResult(r.name, r.description, "cached", 0.0, hit.meta))
    return results


def warm(variants: Sequence[Variant], config: Config, jobs: int | None = None,
         on_done: Callable[[WarmResult], None] | None = None) -> list[WarmResult]:
    """Compile every variant not already cached, in ``jobs`` worker processes (NVRTC holds the GIL,
    so threads would not compile in parallel; 'spawn' keeps workers safe next to a CUDA context).
    A compile failure is a "failed" result; an entry that cannot be written (:class:`CacheWriteError`: no
    space left, ...) stops the warm, starting no further compile, and is raised."""
    jobs = jobs or os.cpu_count() or 1
    cache = DiskCache(config)
    # Cheap hits first, in this process; only misses go to workers.
    results: dict[int, WarmResult] = {}
    todo = []
    for i, v in enumerate(variants):
        hit = None if config.always_compile else cache.lookup(v.name, v.key)
        if hit is not None:
            results[i] = _result(v, "cached", 0.0, hit.meta)
            if on_done:
                on_done(results[i])
        else:
            todo.append(i)
    if jobs <= 1 or len(todo) <= 1:
        for i in todo:
            results[i] = _warm_one(variants[i], config)
            if on_done:
                on_done(results[i])
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
            futures = {pool.submit(_warm_one, variants[i], config): i for i in todo}
            try:
                for fut in concurrent.futures.as_completed(futures):
                    i = futures[fut]
                    results[i] = fut.result()
                    if on_done:
                        on_done(results[i])
            except BaseException:  # a cache that cannot be written (CacheWriteError), ^C: start no more compiles
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    return [results[i] for i in range(len(variants))]


def tuned_docs(config: Config) -> list[dict]:
    """Every tuned table document in the cache dirs and the package (for ``plan``)."""
    import json

    from .tuned import SHIPPED_DIR

    docs = []
    for d in [config.cache_dir / "tuned", *(r / "tuned" for r in config.readonly_cache_dirs), SHIPPED_DIR]:
        for path in sorted(d.glob("*.json")) if d.is_dir() else ():
            try:
                docs.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    return docs
