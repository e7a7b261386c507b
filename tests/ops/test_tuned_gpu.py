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

from gdn_cases import check, forcing, run_case, tuned_case, tuned_entries

pytestmark = pytest.mark.gpu


ENTRIES = tuned_entries()


@pytest.mark.parametrize("table,params,tunables,facts", ENTRIES,
                         ids=[f"{t}-T{p['T']}-{p['state_dtype']}-{'pool' if p['pool'] else 'direct'}-{i}"
                              for i, (t, p, _, _) in enumerate(ENTRIES)])
def test_tuned_entry_variant_matches_reference(table, params, tunables, facts):
    case = tuned_case(params, facts)
    with forcing(tunables):
        check(case, run_case(case, seed=random.Random(json.dumps([params, tunables], sort_keys=True)).randrange(1 << 30)))
