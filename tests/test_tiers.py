"""The test tiers (tests/conftest.py): the default run plus ``GDNJIT_TEST_FULL=1 pytest -m "full or deep"`` is the
full tier; a sampled parametrization keeps the cases its marker asks for; GPU tests are never tiered; a test named
on the command line runs whatever its tier. Checked on real test files, through pytest's own collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_compile_matrix.py", "tests/test_fuzz.py", "tests/ops/test_gdn_gpu.py"]


def collect(full: bool, *args: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "GDNJIT_TEST_FULL"}
    if full:
        env["GDNJIT_TEST_FULL"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args],
                         env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_default_run_and_the_rest_make_the_full_tier():
    default, full, rest = collect(False, *FILES), collect(True, *FILES), collect(True, "-m", "full or deep", *FILES)
    assert default | rest == full
    assert default < full and rest < full
    # run by both: the hypothesis tests (marked deep), at two depths
    assert {n for n in default & rest} == {n for n in full if n.startswith("tests/test_fuzz.py::test_fuzz_")} != set()
    # sample(1): one part of each sharded compile test; sample(1, cover=("arch",)): one part for each arch
    tc = "tests/test_compile_matrix.py::test_tc_form_variants_compile_clean"
    assert {n for n in default if n.startswith(tc)} == {f"{tc}[sm_90-0]", f"{tc}[sm_100a-0]"}
    assert len({n for n in rest if n.startswith(tc)}) == 30
    dispatch = "tests/test_compile_matrix.py::test_dispatch_variants_compile"
    assert {n for n in default if n.startswith(dispatch)} == {f"{dispatch}[0]"}
    # not parametrized, not marked: default only
    assert "tests/test_compile_matrix.py::test_covering_set_covers_every_value" in default - rest
    # GPU tests: all of them in the default run, none in the rest
    gpu = {n for n in full if n.startswith("tests/ops/test_gdn_gpu.py")}
    assert len(gpu) > 100 and gpu <= default and not gpu & rest


def test_a_test_named_on_the_command_line_runs_whatever_its_tier():
    tc = "tests/test_compile_matrix.py::test_tc_form_variants_compile_clean"
    assert collect(False, f"{tc}[sm_100a-7]") == {f"{tc}[sm_100a-7]"}
    assert len(collect(False, tc)) == 32


class _Spec:
    def __init__(self, **params):
        self.params = params


class _Item:
    def __init__(self, **params):
        self.callspec = _Spec(**params)


@pytest.mark.parametrize("n, cover, want", [
    (1, (), {0}),
    (3, (), {0, 6, 11}),          # spread evenly, the first and the last
    (1, ("a",), {0, 4, 8}),       # every value of a
    (1, ("a", "b"), {0, 5, 10, 3}),  # every value of a and of b: greedy, the earliest case first
    (0, ("b",), {0, 1, 2, 3}),
])
def test_sample_keeps_the_cases_asked_for(n, cover, want):
    import conftest

    items = [_Item(a=a, b=b) for a in ("x", "y", "z") for b in range(4)]
    keep = conftest._sample(items, n, cover)
    assert keep == want
    for name in cover:
        assert {items[i].callspec.params[name] for i in keep} == {it.callspec.params[name] for it in items}
