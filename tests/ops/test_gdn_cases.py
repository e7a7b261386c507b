"""The GPU tests' case sets, checked on the CPU: the sampled matrix of test_gdn_gpu.py reaches every axis
value, and every shipped tuned-table entry is a case the GPU test can build and a variant the dispatcher
runs exactly when forced (so test_tuned_gpu.py tests what serving would run)."""

from __future__ import annotations

import dataclasses

import pytest

from gdn_cases import Case, case_params, forced_tunables, sampled_matrix, tuned_case, tuned_entries
from gdnjit.spec import get_spec


def test_matrix_covers_every_axis_value():
    matrix = sampled_matrix(260)
    assert matrix == sampled_matrix(260)  # deterministic: the GPU run tests this same list
    seen = {f.name: {getattr(c, f.name) for c in matrix} for f in dataclasses.fields(Case)}
    assert seen["layout"] == {"klast", "kmajor"} and seen["state_dtype"] == {"fp32", "bf16"}
    assert {1, 2, 3, 4, 7, 8, 16} <= seen["T"] and {64, 128, 256} <= seen["K"] and {64, 128, 256} <= seen["V"]
    assert seen["pool"] == {"direct", "pool", "gaps", "split", "strided"} and True in seen["neg_write"]
    assert {None, "fp32", "bf16"} <= seen["inter_dtype"] and {None, "int32", "int64"} <= seen["ssm"]
    assert seen["update"] == {True, False} and seen["l2norm"] == {True, False}
    assert {1, 3, 37, 130} <= seen["B"] and {1, 2, 3, 4} <= seen["ratio"]


ENTRIES = tuned_entries()


def test_shipped_tables_have_entries():
    assert len(ENTRIES) > 10
    assert {t for t, *_ in ENTRIES} >= {"nvidia-h200", "nvidia-h100-80gb-hbm3"}


@pytest.mark.parametrize("table,params,tunables,facts", ENTRIES, ids=[f"{t}-{i}" for i, (t, *_) in enumerate(ENTRIES)])
def test_tuned_entry_is_a_runnable_case(table, params, tunables, facts):
    spec = get_spec("gdn")
    assert set(params) == set(spec.param_names) and set(tunables) == set(spec.tunable_names)
    assert not spec.violations(params, tunables), f"{table}: the entry's tunables violate the spec's constraints"
    assert case_params(tuned_case(params, facts)) == params
    assert forced_tunables(spec, params, {}, tunables) == tunables  # the dispatcher will run exactly it
