"""Every shipped tuned-table entry's variant, on the GPU against the float64 reference (run on the device:
pytest -m gpu tests/ops/test_tuned_gpu.py).

A tuned entry sends real calls to a variant the rules may never pick, so each distinct (params, tunables)
of every table in gdnjit/tuned/ runs once, forced through the dispatcher, on its own params and H / HV ratio
at a small odd batch (the variant's code does not depend on B beyond the grid size). The tables of every GPU
model are tested on whichever GPU runs this: the variants are sm_90 code either way.
"""

from __future__ import annotations

import json
import random

import pytest

from gdn_cases import Case, case_params, check, forced_tunables, forcing, run_case
from gdnjit.spec import get_spec
from gdnjit.tuned import SHIPPED_DIR

pytestmark = pytest.mark.gpu


def _entries() -> list[tuple[str, dict, dict, dict]]:
    seen = {}
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for e in json.loads(path.read_text())["entries"]:
            if e["spec"] != "gdn":
                continue
            key = json.dumps([e["params"], e["tunables"]], sort_keys=True)
            seen.setdefault(key, (path.stem, e["params"], e["tunables"], e["facts"]))
    return list(seen.values())


def _case(params: dict, facts: dict) -> Case:
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


ENTRIES = _entries()


def test_shipped_tables_have_entries():
    assert len(ENTRIES) > 10


@pytest.mark.parametrize("table,params,tunables,facts", ENTRIES,
                         ids=[f"{t}-T{p['T']}-{p['state_dtype']}-{'pool' if p['pool'] else 'direct'}-{i}"
                              for i, (t, p, _, _) in enumerate(ENTRIES)])
def test_tuned_entry_variant_matches_reference(table, params, tunables, facts):
    case = _case(params, facts)
    assert forced_tunables(get_spec("gdn"), params, {}, tunables) == tunables  # the dispatcher will run exactly it
    with forcing(tunables):
        check(case, run_case(case, seed=random.Random(json.dumps([params, tunables], sort_keys=True)).randrange(1 << 30)))
