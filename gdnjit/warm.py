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
from .cache.key import cache_key
from .config import Config
from .errors import CompileError
from .shapes import Problem, iter_facts
from .spec import get_spec
from .variant import Variant

# SM counts of the parts of each arch (the rules may depend on num_sms): H100 SXM/H200, H100 PCIe, H20;
# B200; B300; RTX PRO 6000 / RTX 5090.
KNOWN_SM_COUNTS = {90: (132, 114, 78), 100: (148,), 103: (148,), 120: (188, 170)}


def sm_counts_for(arch: str) -> tuple[int, ...]:
    from .compile import check_arch

    number, _ = check_arch(arch)
    if number not in KNOWN_SM_COUNTS:
        raise ValueError(f"arch: no known SM counts for {arch}; pass --num-sms")
    return KNOWN_SM_COUNTS[number]


def plan(problems: Iterable[Problem], archs: Sequence[str], num_sms: Sequence[int] | None = None) -> list[Variant]:
    """Every distinct variant the dispatcher selects for the problems, archs and SM counts, in order."""
    seen: dict[tuple, Variant] = {}
    for arch in archs:
        counts = tuple(num_sms) if num_sms else sm_counts_for(arch)
        for prob in problems:
            spec = get_spec(prob.spec)
            params = dict(prob.params)
            for sms in counts:
                for facts in iter_facts(prob, sms):
                    tunables, _ = dispatch.select(spec, params, {f: facts[f] for f in spec.facts})
                    memo = (spec.name, prob.params, tuple(tunables.items()), arch)
                    if memo not in seen:
                        seen[memo] = Variant.make(spec, params, tunables, arch)
    return list(seen.values())


@dataclasses.dataclass
class WarmResult:
    variant: Variant
    status: str  # "cached", "compiled" or "failed"
    seconds: float
    meta: dict
    error: str = ""


def warm(variants: Sequence[Variant], config: Config, jobs: int | None = None,
         on_done: Callable[[WarmResult], None] | None = None) -> list[WarmResult]:
    """Compile every variant not already cached (``jobs`` threads; NVRTC runs without the GIL)."""
    cache = DiskCache(config)

    def one(variant: Variant) -> WarmResult:
        t0 = time.perf_counter()
        hit = None if config.always_compile else cache.lookup(variant.name, cache_key(variant.key_fields))
        if hit is not None:
            return WarmResult(variant, "cached", time.perf_counter() - t0, hit.meta)
        try:
            entry = cache.get_or_build(variant.name, variant.key_fields, variant.build)
        except CompileError as e:
            return WarmResult(variant, "failed", time.perf_counter() - t0, {}, e.dump())
        status = "compiled" if entry.origin == "built" else "cached"
        return WarmResult(variant, status, time.perf_counter() - t0, entry.meta)

    jobs = jobs or os.cpu_count() or 1
    results: list[WarmResult] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for res in pool.map(one, variants):
            results.append(res)
            if on_done:
                on_done(res)
    return results
