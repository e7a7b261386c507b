"""Tuned tables: measured best tunables per problem for one GPU model, written by ``gdnjit tune``.

A table is JSON: ``{"device": name, "arch": ..., "num_sms": ..., "entries": [{"spec", "params",
"facts", "tunables", "us", "rule_us", "top"}]}`` (``top``: the fastest candidates with their
times). Tables are looked up by a slug of the GPU name in the writable cache dir
(``<cache>/tuned/``), the read-only cache dirs, then the package's shipped ``gdnjit/tuned/``. The
dispatcher uses the entry with the same spec, params and facts (gdn: H, HV) whose value of the
spec's batch fact (gdn: B, nvfp4_quantize: M) is nearest (in log scale) to the call's, within a
factor of 2; without one it falls back to the spec's rules.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .config import Config
from .spec import get_spec

SHIPPED_DIR = Path(__file__).parent / "tuned"
# A tuned entry serves batch sizes within this factor of its own. Not more: the best variant changes with how B * HV
# fills waves of num_sms CTAs (docs/perf.md v16, v16c: with 4, H200 entries tuned at B = 1 / 8 served B = 3..4 /
# 12 up to 1.28x slower than the rules).
MAX_B_RATIO = 2


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table_paths(config: Config, device_name: str) -> list[Path]:
    slug = device_slug(device_name)
    dirs = [config.cache_dir / "tuned", *(d / "tuned" for d in config.readonly_cache_dirs), SHIPPED_DIR]
    return [d / f"{slug}.json" for d in dirs]


class TunedTable:
    """Lookup structure over one or more tuned tables (at equal batch size the first file's entry wins)."""

    def __init__(self, entries: list[dict[str, Any]]):
        self._by_problem: dict[tuple, list[tuple[int, dict]]] = {}
        for e in entries:
            batch = _batch_fact(e["spec"])
            if batch is None or batch not in e["facts"]:
                continue  # an entry of a spec this gdnjit does not ship (or malformed): the rules decide
            key = _problem_key(e["spec"], e["params"], e["facts"], batch)
            self._by_problem.setdefault(key, []).append((int(e["facts"][batch]), e["tunables"]))

    def lookup(self, spec: str, params: dict[str, Any], facts: dict[str, Any],
               batch_invariant: bool = False) -> dict[str, Any] | None:
        """The tunables of the entry for these params and facts (all but the spec's batch fact and
        num_sms) whose batch-fact value is nearest to the call's (log scale; ties to the smaller), if
        that is within a factor of :data:`MAX_B_RATIO`; else None (the rules decide: a table tuned at
        B = 8 says nothing about B = 512). ``batch_invariant``: the batch fact is the spec's
        ``invariant_batch`` (:meth:`gdnjit.spec.Spec.dispatch_facts`)."""
        batch = _batch_fact(spec)
        if batch is None:
            return None
        facts = get_spec(spec).dispatch_facts(facts, batch_invariant)
        cands = self._by_problem.get(_problem_key(spec, params, facts, batch))
        if not cands:
            return None
        B = max(int(facts.get(batch, 1)), 1)
        tb, tunables = min(cands, key=lambda c: (abs(math.log(c[0]) - math.log(B)), c[0]))
        return tunables if abs(math.log(tb) - math.log(B)) <= math.log(MAX_B_RATIO) + 1e-9 else None

    def covers(self, spec: str, params: dict[str, Any], facts: dict[str, Any]) -> bool:
        """Whether the table has entries for these params and facts (all but the batch fact and num_sms, which
        may be absent): False means :meth:`lookup` returns None for every batch size."""
        batch = _batch_fact(spec)
        return batch is not None and _problem_key(spec, params, facts, batch) in self._by_problem

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_problem.values())


def _batch_fact(spec: str) -> str | None:
    try:
        return get_spec(spec).batch_fact
    except ValueError:
        return None


def _problem_key(spec: str, params: dict[str, Any], facts: dict[str, Any], batch: str) -> tuple:
    # keyed by the params dispatch sees (Spec.dispatch_view): modes that compute alike share entries; a param
    # the spec gained after a table was written takes its first listed value (what the table was tuned with)
    s = get_spec(spec)
    params = s.dispatch_view({**{n: v[0] for n, v in s.params}, **params})
    return (spec, tuple(sorted(params.items())),
            tuple(sorted((f, v) for f, v in facts.items() if f not in (batch, "num_sms"))))


def load_tables(config: Config, device_name: str) -> TunedTable:
    entries: list[dict[str, Any]] = []
    for path in table_paths(config, device_name):
        try:
            doc = json.loads(path.read_text())
            entries += [e for e in doc.get("entries", []) if {"spec", "params", "facts", "tunables"} <= set(e)]
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError) as e:
            import logging

            logging.getLogger("gdnjit").warning("gdnjit: ignoring unreadable tuned table %s: %s", path, e)
    return TunedTable(entries)


def write_table(path: Path, doc: dict[str, Any]) -> None:
    """Write a tuned table document to ``path`` whole (readable by other users as the umask allows)."""
    from .atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode())
