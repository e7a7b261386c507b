"""``gdnjit tune``: measure every valid tunable choice on this GPU and record the fastest.

For each problem of a shapes file and each batch size it compiles all candidates (cached), times
each with CUDA-graph replays rotating over enough input sets that the working set is >= 3x L2,
and writes a tuned table (``gdnjit/tuned.py``) that the dispatcher then prefers over the rules.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from typing import Any, Callable

from . import expr as _expr
from .runner import RUNNER, device_info
from .config import Config
from .shapes import Problem, iter_facts, params_for
from .spec import get_spec
from .variant import Variant
from .warm import first_launch_variant, warm

_MAX_SETS = 64
_TOP = 8  # fastest candidates kept per entry
_MEM_CAP = 24 << 30


def _input_sets(spec, params: dict[str, Any], facts: dict[str, Any], device, n_sets_for: Callable[[int], int]):
    """Input sets for one problem from the spec's op module (``example_call``): a list of (kernel args in
    launch order, the named call's PDL choice, the tensors they point into), as many as ``n_sets_for``
    asks for the bytes of one set."""
    if not spec.module:
        raise ValueError(f"spec {spec.name}: no `module` (the op module whose example_call gives tune its inputs)")
    op = importlib.import_module(f"gdnjit.{spec.module}")
    sets = []
    while True:
        call, tensors = op.example_call(params, facts, device)
        sets.append((call.arg_values(), call.pdl, tensors))
        set_bytes = sum(t.numel() * t.element_size() for t in tensors if t is not None)
        if len(sets) >= n_sets_for(set_bytes):
            return sets


def candidate_tunables(spec, params: dict[str, Any], where: str | None,
                       always: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The valid tunable choices for ``params`` for which ``where`` (an expression over params and
    tunables; None: all) holds, then those of ``always`` (the rules' choices) not yet among them."""
    out = [t for t in spec.all_tunable_choices() if spec.valid(params, t)
           and (where is None or _expr.evaluate(where, {**params, **t}))]
    for t in always:
        if t not in out:
            out.append(t)
    return out


def tune(problems: list[Problem], config: Config, device_index: int = 0, batch_sizes: list[int] | None = None,
         log: Callable[[str], None] = print, where: str | None = None) -> list[dict[str, Any]]:
    """Measure all valid candidates for each (problem, B); returns tuned-table entries. A candidate is timed as one
    launch of the op module's ``example_call`` inputs or, where the module has ``example_steps`` (the lazy state:
    a step is one or two launches, and its folds come every few steps), as its steps over whole fold cycles; an op
    module's ``TUNE_WHERE`` narrows the candidates as ``where`` does.

    ``where``: an expression over params and tunables that narrows the candidates (the choice of the
    rules is measured in any case, so every entry is compared with what the dispatcher would do)."""
    import torch

    from . import dispatch
    from .timing import time_graph_us

    info = device_info(device_index)
    device = torch.device("cuda", device_index)
    l2 = torch.cuda.get_device_properties(device_index).L2_cache_size

    def n_sets_for(set_bytes: int) -> int:
        want = max(2, math.ceil(3 * l2 / max(set_bytes, 1)))
        return max(1, min(want, _MAX_SETS, _MEM_CAP // max(set_bytes, 1)))

    entries = []
    seen = set()
    for prob in problems:
        spec = get_spec(prob.spec)
        params = params_for(prob, info.arch)
        values = batch_sizes or prob.batch_sizes
        problem_facts = [f for f in iter_facts(dataclasses.replace(prob, batch_sizes=tuple(values)), info.num_sms)]
        rule_choices = [dispatch.select(spec, params, {f: facts[f] for f in spec.facts})[0] for facts in problem_facts]
        op = importlib.import_module(f"gdnjit.{spec.module}") if spec.module else None
        own = getattr(op, "TUNE_WHERE", None)  # the op's limit on what a tuned table may choose
        narrowed = where if own is None else own if where is None else f"({where}) and ({own})"
        candidates = candidate_tunables(spec, params, narrowed, rule_choices)
        variants = [Variant.make(spec, params, t, info.arch) for t in candidates]
        firsts = {f.name: f for v in variants for facts in problem_facts  # launches a candidate makes first
                  for f in [first_launch_variant(spec, params, dict(v.tunables), facts, info.arch)] if f is not None}
        warm(variants + list(firsts.values()), config)
        timing = getattr(op, "example_steps", None)  # an op whose calls are timed as steps (several launches)
        for facts, rule_tunables in zip(problem_facts, rule_choices):
            memo = (spec.name, tuple(params.items()), tuple(sorted(facts.items())))
            if memo in seen:
                continue
            seen.add(memo)
            timings = []
            if timing is not None:
                sets = timing(params, facts, device, n_sets_for)  # held until the `del` below, as the launches' sets
                n_sets, steps_for = sets
                for variant in variants:
                    fn, calls = steps_for(dict(variant.tunables))
                    timings.append((time_graph_us(fn, n_sets, calls=calls), dict(variant.tunables)))
            else:
                sets = _input_sets(spec, params, facts, device, n_sets_for)
                pdl = sets[0][1]  # launched as the op launches them
                for variant in variants:
                    launcher = RUNNER.get_launcher(variant, device_index, config)
                    ctx = dict(variant.values)
                    ctx.update(facts)
                    grid = int(_expr.evaluate(dict(spec.launch)["grid"], ctx))
                    launch = launcher.launch_pdl if pdl else launcher
                    us = time_graph_us(lambda i: launch(grid, sets[i][0]), len(sets))
                    timings.append((us, dict(variant.tunables)))
            timings.sort(key=lambda x: x[0])
            best_us, best = timings[0]
            rule_us = next(us for us, t in timings if t == rule_tunables)
            shown = {f: v for f, v in facts.items() if f != "num_sms"}
            entries.append({"spec": spec.name, "params": params, "facts": shown,
                            "tunables": best, "us": round(best_us, 2), "rule_us": round(rule_us, 2),
                            "candidates": len(timings),
                            # the runners-up, for writing rules that hold across problems
                            "top": [{"us": round(us, 2), "tunables": t} for us, t in timings[:_TOP]]})
            log(f"{spec.name} {prob.call} {' '.join(f'{f}={v}' for f, v in shown.items())}: best {best} "
                f"{best_us:.1f} us, rules {rule_tunables} {rule_us:.1f} us ({len(timings)} candidates)")
            del sets
            torch.cuda.empty_cache()
    return entries


def table_doc(entries: list[dict[str, Any]], device_index: int = 0) -> dict[str, Any]:
    from .version import __version__

    info = device_info(device_index)
    return {"device": info.name, "arch": info.arch, "num_sms": info.num_sms, "gdnjit_version": __version__,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "entries": entries}
