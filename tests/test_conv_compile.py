"""The causal_conv1d_update spec's variants compile for sm_90 (and one for sm_100a) with no spills, no stack
frame and no warnings, on the CPU: a covering set of params (every value of every param occurs) with the
rules' choice at B = 1 and 512, and every tunable choice of the heaviest params (W = 6, T = 8, fp32)."""

from __future__ import annotations

import concurrent.futures
import random

import pytest

from gdnjit import dispatch
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

SPEC = get_spec("causal_conv1d_update")
FACTS = [{"B": B, "D": 12288, "num_sms": 132} for B in (1, 512)]
HEAVY = dict(x_dtype="fp32", state_dtype="fp32", w_dtype="fp32", W=6, T=8, idx_dtype="int64", acc_dtype="int64",
             qsl_dtype="int64", bias=True, silu=True)


def covering_params(n: int = 24) -> list[dict]:
    """n param sets, each param's values dealt round-robin over them in a fixed shuffled order."""
    rng = random.Random(20261125)
    cols = {}
    for name, vals in SPEC.params:
        col = [vals[i % len(vals)] for i in range(n)]
        rng.shuffle(col)
        cols[name] = col
    return [{name: cols[name][i] for name in SPEC.param_names} for i in range(n)]


def variants() -> list[Variant]:
    out = {}
    for p in covering_params():
        for facts in FACTS:
            t, _ = dispatch.select(SPEC, p, facts)
            v = Variant.make(SPEC, p, t, "sm_90")
            out[v.key] = v
    for contig in (False, True):
        p = dict(HEAVY, contig=contig)
        for t in SPEC.all_tunable_choices():
            if SPEC.valid(p, t):
                v = Variant.make(SPEC, p, t, "sm_90")
                out[v.key] = v
    return list(out.values())


def test_covering_set_covers_every_value():
    params = covering_params()
    for name, vals in SPEC.params:
        assert {p[name] for p in params} == set(vals), name


def test_every_variant_compiles_clean():
    todo = variants()
    assert len(todo) >= 40
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        metas = list(pool.map(lambda v: v.build().meta, todo))
    bad = [f"{v.describe()}: {m}" for v, m in zip(todo, metas)
           if m["spill_bytes"] or m["stack_bytes"] or m["warnings"] or m["registers"] <= 0]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("arch", ["sm_100a"])
def test_other_targets_compile(arch):
    t, _ = dispatch.select(SPEC, dict(HEAVY, contig=True), FACTS[1])
    meta = Variant.make(SPEC, dict(HEAVY, contig=True), t, arch).build().meta
    assert meta["spill_bytes"] == 0 and meta["registers"] > 0


def test_rules_choose_vectors_only_where_the_layout_allows():
    for p in covering_params():
        for facts in FACTS:
            t, _ = dispatch.select(SPEC, p, facts)
            assert p["contig"] or t["vec"] == 1
