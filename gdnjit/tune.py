"""``gdnjit tune``: measure every valid tunable choice on this GPU and record the fastest.

For each problem of a shapes file and each batch size it compiles all candidates (cached), times
each with CUDA-graph replays rotating over enough input sets that the working set is >= 3x L2,
and writes a tuned table (``gdnjit/tuned.py``) that the dispatcher then prefers over the rules.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from . import expr as _expr
from .runner import RUNNER, device_info
from .config import Config
from .shapes import Problem
from .spec import get_spec
from .variant import Variant
from .warm import warm

_MAX_SETS = 64
_TOP = 8  # fastest candidates kept per entry
_MEM_CAP = 24 << 30


def _gdn_calls(params: dict[str, Any], B: int, H: int, HV: int, device, n_sets_for: Callable[[int], int]):
    """Input sets for one gdn problem; returns a list of prepared kernel-argument tuples."""
    import torch

    from . import gdn

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32,
          "int64": torch.int64}
    K, V, T = params["K"], params["V"], params["T"]
    trailing = (HV, V, K) if params["layout"] == "klast" else (HV, K, V)
    sdt = dt[params["state_dtype"]]
    slots = B * (T + 1) if params["ssm_idx_dtype"] != "none" else (2 * B if not params["same_pool"] else B)
    state_bytes = slots * HV * V * K * torch.empty(0, dtype=sdt).element_size()
    calls = []
    for _ in range(n_sets_for(state_bytes)):
        ind = dt[params["in_dtype"]]
        q = torch.randn(B, T, H, K, device=device, dtype=ind)
        k = torch.randn(B, T, H, K, device=device, dtype=ind)
        v = torch.randn(B, T, HV, V, device=device, dtype=ind)
        a = torch.randn(B, T, HV, device=device, dtype=ind)
        b = torch.randn(B, T, HV, device=device, dtype=ind)
        A_log = torch.rand(HV, device=device)
        dt_bias = torch.randn(HV, device=device).to(dt[params["dtb_dtype"]])
        pool = torch.randn(slots, *trailing, device=device).to(sdt)
        read = write = inter = ssm = None
        if params["pool"]:
            idt = dt[params["idx_dtype"]]
            read = torch.randperm(B, device=device).to(idt)
            if not params["same_pool"]:
                write = (B + torch.randperm(B, device=device)).to(idt)
            if params["ssm_idx_dtype"] != "none":
                ssm = (B + torch.randperm(B * T, device=device)).reshape(B, T).to(dt[params["ssm_idx_dtype"]])
        if params["inter_dtype"] != "none":
            inter = torch.empty(B, T, *trailing, device=device, dtype=dt[params["inter_dtype"]])
        out = torch.empty(B, T, HV, V, device=device, dtype=dt[params["out_dtype"]])
        _, call = gdn._prepare(params["layout"], q, k, v, A_log, a, dt_bias, b, pool, read, write, None, out, inter,
                               ssm, params["update"], params["l2norm"], not params["pool"])
        # the kernel arguments in launch order, and the tensors they point into (kept alive while timing)
        calls.append((call.arg_values(), (q, k, v, a, b, A_log, dt_bias, pool, read, write, inter, ssm, out)))
    return calls


def _gdn_uses_pdl(device_index: int) -> bool:
    from . import gdn

    return gdn.uses_pdl(device_index)


_BUILDERS = {"gdn": _gdn_calls}
_USES_PDL = {"gdn": _gdn_uses_pdl}


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
    """Measure all valid candidates for each (problem, B); returns tuned-table entries.

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
        params = dict(prob.params)
        rule_choices = []
        for B in batch_sizes or prob.batch_sizes:
            facts = {"B": B, "H": prob.H, "HV": prob.HV, "num_sms": info.num_sms}
            rule_choices.append(dispatch.select(spec, params, {f: facts[f] for f in spec.facts})[0])
        candidates = candidate_tunables(spec, params, where, rule_choices)
        variants = [Variant.make(spec, params, t, info.arch) for t in candidates]
        warm(variants, config)
        for B in batch_sizes or prob.batch_sizes:
            memo = (prob.params, B, prob.H, prob.HV)
            if memo in seen:
                continue
            seen.add(memo)
            facts = {"B": B, "H": prob.H, "HV": prob.HV, "num_sms": info.num_sms}
            rule_tunables, _ = dispatch.select(spec, params, {f: facts[f] for f in spec.facts})
            sets = _BUILDERS[spec.name](params, B, prob.H, prob.HV, device, n_sets_for)
            pdl = _USES_PDL[spec.name](device_index)  # launched as the op launches them
            timings = []
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
            entries.append({"spec": spec.name, "params": params, "facts": {"B": B, "H": prob.H, "HV": prob.HV},
                            "tunables": best, "us": round(best_us, 2), "rule_us": round(rule_us, 2),
                            "candidates": len(timings),
                            # the runners-up, for writing rules that hold across problems
                            "top": [{"us": round(us, 2), "tunables": t} for us, t in timings[:_TOP]]})
            log(f"{spec.name} {prob.call} B={B} H={prob.H} HV={prob.HV} T={params.get('T')}: best {best} "
                f"{best_us:.1f} us, rules {rule_tunables} {rule_us:.1f} us ({len(timings)} candidates)")
            del sets
            torch.cuda.empty_cache()
    return entries


def table_doc(entries: list[dict[str, Any]], device_index: int = 0) -> dict[str, Any]:
    from .version import __version__

    info = device_info(device_index)
    return {"device": info.name, "arch": info.arch, "num_sms": info.num_sms, "gdnjit_version": __version__,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "entries": entries}
