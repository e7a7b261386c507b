"""The dispatcher's rules (gdnjit/dispatch.py over the shipped specs): no rule is dead, and the T = 1 batch
regions pick what docs/perf.md v15 / v15b measured."""

from __future__ import annotations

import itertools

import pytest

from gdnjit import dispatch
from gdnjit.spec import get_spec
from gdnjit.gdn import NATIVE_CONVENTIONS

_GDN_BASE = dict(dtb_dtype="fp32", idx_dtype="int32", same_pool=True, l2norm=True, out_dtype="bf16", update=True,
                 slot_strided=False, **NATIVE_CONVENTIONS)


def _gdn_grid():
    """Params x facts over every value a gdn rule's `when` tests (H = 16, 132 SMs)."""
    for layout, (K, V), T, sd, ind, inter, ssm, pool in itertools.product(
            ["klast", "kmajor"], [(128, 128), (64, 64), (256, 256), (128, 256)], [1, 2, 3, 4, 6, 7, 8, 12],
            ["fp32", "bf16"], ["bf16", "fp16"], ["none", "bf16"], ["none", "int32"], [False, True]):
        params = dict(_GDN_BASE, layout=layout, K=K, V=V, T=T, state_dtype=sd, in_dtype=ind, inter_dtype=inter,
                      ssm_idx_dtype=ssm, pool=pool)
        for B, HV in itertools.product([1, 2, 3, 4, 6, 8, 32, 512], [16, 32, 48, 64]):
            yield params, dict(B=B, H=16, HV=HV, num_sms=132)
    for T, sd, mode in itertools.product([1, 4, 8], ["fp32", "bf16"], ["step", "flush"]):  # the fused speculative step
        yield (dict(_GDN_BASE, layout="klast", K=128, V=128, T=T, state_dtype=sd, in_dtype="bf16", inter_dtype="none",
                    ssm_idx_dtype="none", pool=True, update=False, fused_step=mode), dict(B=64, H=16, HV=64, num_sms=132))
    for T, sd, (cache, replay, update, gates) in itertools.product(  # FlashInfer's ReplaySSM: the verify, the commit
            [2, 4, 8], ["fp32", "bf16"], [(True, False, False, "raw"), (False, True, True, "given")]):
        yield (dict(_GDN_BASE, layout="klast", K=128, V=128, T=T, state_dtype=sd, in_dtype="bf16", inter_dtype="none",
                    ssm_idx_dtype="none", pool=True, update=update, gates=gates, replay_cache=cache, replay=replay),
               dict(B=64, H=16, HV=64, num_sms=132))


def _nvfp4_grid():
    spec = get_spec("nvfp4_quantize")
    for in_dtype, sf_layout, K, hw, pdl, scale in itertools.product(
            spec.allowed("in_dtype"), spec.allowed("sf_layout"), [16, 2048, 7168], [False, True], [False, True],
            spec.allowed("scale")):
        if scale == "token" and in_dtype == "fp8e4m3":  # per-token scales take fp16 / bf16 (the op refuses fp8)
            continue
        for M in (1, 128, 4096, 16384, 1 << 17):
            yield (dict(in_dtype=in_dtype, sf_layout=sf_layout, K=K, hw_e2m1=hw, pdl=pdl, recipe="fast", scale=scale,
                        four_over_six="off"), dict(M=M, num_sms=132))


@pytest.mark.parametrize("name, grid", [("gdn", _gdn_grid), ("nvfp4_quantize", _nvfp4_grid)])
def test_every_conditional_rule_is_chosen_somewhere(name, grid):
    """A rule whose `when` is covered by an earlier rule never fires; this caught the 3-4 token small-batch
    rule (`T <= 4`) shadowing the T = 1 small-batch rule (docs/perf.md v15). Fallbacks (no `when`) are exempt."""
    spec = get_spec(name)
    chosen = set()
    for params, facts in grid():
        _, rule = dispatch.select(spec, params, facts)
        chosen.add(id(rule))
    dead = [f"rule {i}: {r.when}" for i, r in enumerate(spec.rules) if r.when is not None and id(r) not in chosen]
    assert not dead, "rules never chosen on the grid:\n" + "\n".join(dead)


def _t1(state_dtype, pool, B, HV, K=128, V=128):
    params = dict(_GDN_BASE, layout="klast", K=K, V=V, T=1, state_dtype=state_dtype, in_dtype="bf16",
                  inter_dtype="none", ssm_idx_dtype="none", pool=pool)
    t, _ = dispatch.select(get_spec("gdn"), params, dict(B=B, H=16, HV=HV, num_sms=132))
    return (t["lanes_per_row"], t["ilp"], t["tile_v"], t["stage"], t["l2_prefetch"])


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("pool", [False, True])
def test_t1_small_and_mid_batch_rules(state_dtype, pool):
    """T = 1, K = V = 128, 132 SMs: the rules of docs/perf.md v15b by B * HV (unstaged at every size)."""
    small = (8, 2, 32, False, True)
    mid = (16, 4, 64, False, True) if state_dtype == "fp32" else (4, 2, 32, False, True)
    for B, HV in ((1, 16), (1, 64), (2, 32), (4, 16)):  # B * HV <= 64
        assert _t1(state_dtype, pool, B, HV) == small
    for B, HV in ((2, 64), (4, 32), (8, 16)):  # 128
        assert _t1(state_dtype, pool, B, HV) == mid
    for B, HV in ((4, 64), (8, 32)):  # 256
        got = _t1(state_dtype, pool, B, HV)
        if pool:
            assert got == (8, 4, 128, False, True)
        elif state_dtype == "fp32":
            assert got == (8, 4, 128, False, False)
        else:
            assert got == (8, 4, 16, False, False)  # bf16 direct: the large-batch bf16 rule was already the best
    for B, HV in ((3, 64), (4, 48), (6, 32)):  # 192: whole-head CTAs would leave 27% of their second wave empty (v16d)
        if state_dtype == "fp32":
            assert _t1(state_dtype, pool, B, HV) == (8, 4, 64, False, False)
        else:
            assert _t1(state_dtype, pool, B, HV) == ((8, 4, 128, False, True) if pool else (8, 4, 16, False, False))
    assert _t1(state_dtype, pool, 16, 64) == ((8, 2, 32, False, False) if state_dtype == "fp32" else (8, 4, 16, False, False))
    assert _t1(state_dtype, pool, 1, 64, K=256)[2] == 8  # K = 256 small batch keeps its 8-row tiles


def _mid(T, state_dtype, inter, B, HV=32, H=8):
    params = dict(_GDN_BASE, layout="klast", K=128, V=128, T=T, state_dtype=state_dtype, in_dtype="bf16",
                  inter_dtype=inter, ssm_idx_dtype="none", pool=True, update=inter == "none")
    t, _ = dispatch.select(get_spec("gdn"), params, dict(B=B, H=H, HV=HV, num_sms=132))
    return (t["form"], t["lanes_per_row"], t["ilp"], t["tile_v"], t["pipe"], t["stage"], t["l2_prefetch"])


def test_multi_token_mid_batch_rules():
    """T > 1 between the small-batch rules and B * HV = 1024 (docs/perf.md v15c, v16), HV = 32, 132 SMs."""
    for B in (4, 8, 16):
        assert _mid(2, "fp32", "none", B) == ("recurrent", 8, 2, 16, 2, True, False)
        assert _mid(4, "fp32", "none", B) == (("mma", 4, 1, 32, 1, True, True) if B == 4 else
                                              ("recurrent", 8, 2, 32, 2, True, False))
        assert _mid(2, "bf16", "none", B) == ("mma", 4, 1, 32, 1, True, True)
        assert _mid(8, "bf16", "none", B)[0] == "tc"
        assert _mid(2, "fp32", "fp32", B) == (("recurrent", 8, 4, 32, 1, True, True) if B == 4 else
                                              ("recurrent", 16, 2, 8, 1, False, True))
        assert _mid(2, "bf16", "bf16", B) == ("recurrent", 8, 4, 64, 1, True, True)
        assert _mid(4, "bf16", "bf16", B) == ("recurrent", 8, 2, 32, 1, False, True)
    assert _mid(4, "bf16", "none", 4) == _mid(4, "bf16", "none", 8) == ("mma", 4, 1, 64, 1, True, True)
    assert _mid(4, "bf16", "none", 16)[0] == "tc"
    assert _mid(8, "fp32", "none", 8) == _mid(8, "fp32", "none", 16) == ("mma", 4, 1, 64, 2, True, False)
    assert _mid(8, "fp32", "none", 4) == ("mma", 4, 1, 128, 1, True, True)
    assert _mid(8, "fp32", "fp32", 4) == _mid(8, "fp32", "fp32", 8) == ("recurrent", 16, 4, 64, 2, True, False)
    assert _mid(3, "fp32", "fp32", 4) == _mid(3, "fp32", "fp32", 8) == ("recurrent", 8, 2, 8, 1, False, False)
    assert _mid(3, "bf16", "none", 8) == ("mma", 4, 1, 32, 1, True, True)
    assert _mid(6, "bf16", "bf16", 8) == ("recurrent", 8, 2, 64, 2, True, False)
    assert _mid(8, "fp32", "fp32", 16) == ("recurrent", 16, 4, 8, 1, False, False)  # the verify rule from 512
    # B * HV >= 1024: the large-batch rules, untouched
    assert _mid(2, "fp32", "none", 32) == ("recurrent", 8, 4, 64, 2, True, False)
    assert _mid(8, "bf16", "none", 32)[0] == "tc" and _mid(2, "fp32", "fp32", 32)[3] == 8


def test_mid_batch_rules_by_waves():
    """v16 (H = 16, HV 32 / 48 / 64 on the H200): fp32 T 7-8 picks whole heads while B * HV fits one wave of
    num_sms CTAs, half heads one item per CTA at (1, 1.5] and (2, 3] x num_sms, two items per CTA between and
    above; verify T = 2 and mtp T = 4 have their own tiles up to num_sms heads, verify T 4-6 below 2 num_sms
    where the two-item grid would fill less than 90% of its waves (v16b)."""
    whole, half, half2 = ("mma", 4, 1, 128, 1, True, True), ("mma", 4, 1, 64, 1, True, True), ("mma", 4, 1, 64, 2, True, False)
    for B, HV, want in ((2, 48, whole), (2, 64, whole), (3, 48, half), (4, 48, half), (6, 32, half), (4, 64, half2),
                        (6, 48, half), (8, 48, half), (12, 32, half), (8, 64, half2), (16, 48, half2)):
        assert _mid(8, "fp32", "none", B, HV=HV, H=16) == want, (B, HV)
        assert _mid(7, "fp32", "none", B, HV=HV, H=16) == want, (B, HV)
    for B, HV in ((2, 48), (3, 32), (2, 64)):  # B * HV <= num_sms
        assert _mid(4, "fp32", "none", B, HV=HV, H=16) == ("mma", 4, 1, 32, 1, True, True)
        assert _mid(2, "fp32", "fp32", B, HV=HV, H=16) == ("recurrent", 8, 4, 32, 1, True, True)
    assert _mid(4, "fp32", "none", 3, HV=48, H=16) == ("recurrent", 8, 2, 32, 2, True, False)
    assert _mid(2, "fp32", "fp32", 3, HV=48, H=16) == ("recurrent", 16, 2, 8, 1, False, True)
    for T in (4, 5, 6):
        for B, HV in ((2, 48), (3, 48), (4, 48), (6, 32)):  # B * HV * 4 < 8 * num_sms, a part-filled last wave
            assert _mid(T, "fp32", "fp32", B, HV=HV, H=16) == ("recurrent", 16, 2, 16, 1, False, True)
        for B, HV in ((2, 64), (4, 32), (4, 64), (8, 32), (6, 48)):  # full waves (128, 256) or B * HV * 4 >= 8 * num_sms
            assert _mid(T, "fp32", "fp32", B, HV=HV, H=16) != ("recurrent", 16, 2, 16, 1, False, True)
    assert _mid(8, "fp32", "fp32", 4, HV=48, H=16) == ("recurrent", 16, 4, 64, 2, True, False)  # T 7-8 unchanged


def test_bf16_update_t4_takes_tc_past_two_waves():
    """v16e (H200, H = 16): bf16 update T = 4 keeps the mma form up to 2 num_sms heads, the tc form above."""
    for B, HV in ((6, 48), (6, 64), (12, 32), (5, 64)):  # 288, 384, 384, 320
        assert _mid(4, "bf16", "none", B, HV=HV, H=16)[0] == "tc", (B, HV)
    for B, HV in ((4, 64), (8, 32), (4, 48), (2, 64)):  # 256, 256, 192, 128
        assert _mid(4, "bf16", "none", B, HV=HV, H=16) == ("mma", 4, 1, 64, 1, True, True), (B, HV)


def test_plain_multi_token_takes_tc_from_1024_heads():
    """v29 (H100 same-run timing against the recurrent rules, HV 32 / 64, B 32..512): the state-updating call without
    a buffer takes the tc form from B * HV = 1024 for fp32 state at T 3..8 and bf16 state at T = 3 too; where the tc
    form cannot run (fp16 q/k, K != 128) the recurrent rules still decide. T = 2 (v31, H200 and H100): the tc form for the
    bf16 state update from B * HV = 1024, not for fp32 state nor the output-only verify."""
    for T in range(3, 9):
        for sd in ("fp32", "bf16"):
            for B, HV in ((32, 32), (16, 64), (128, 64), (512, 32)):
                assert _mid(T, sd, "none", B, HV=HV, H=16) == ("tc", 4, 1, 64, 1, True, False), (T, sd, B, HV)
    assert _mid(3, "bf16", "none", 8, HV=64, H=16)[0] != "tc"  # B * HV 512: the T = 3 rule starts at 1024
    assert _mid(3, "fp32", "none", 8, HV=64, H=16)[0] != "tc"
    assert _mid(2, "fp32", "none", 32, HV=64, H=16)[0] == "recurrent"
    for B, HV in ((32, 32), (16, 64), (128, 64), (512, 32)):
        assert _mid(2, "bf16", "none", B, HV=HV, H=16) == ("tc", 4, 1, 64, 1, True, False), (B, HV)
    assert _mid(2, "bf16", "none", 8, HV=64, H=16)[0] != "tc"  # B * HV 512
    spec = get_spec("gdn")
    base2 = dict(_GDN_BASE, layout="klast", K=128, V=128, T=2, state_dtype="bf16", in_dtype="bf16", inter_dtype="none",
                 ssm_idx_dtype="none", pool=True, update=True)
    facts = dict(B=128, H=16, HV=64, num_sms=132)
    assert dispatch.select(spec, dict(base2, update=False), facts)[0]["form"] == "recurrent"  # output-only verify
    assert dispatch.select(spec, dict(base2, in_dtype="fp16"), facts)[0]["form"] == "recurrent"
    for T in (3, 4, 6):
        for change in (dict(in_dtype="fp16"), dict(K=64, V=64)):
            params = dict(_GDN_BASE, layout="klast", K=128, V=128, T=T, state_dtype="fp32", in_dtype="bf16",
                          inter_dtype="none", ssm_idx_dtype="none", pool=True, update=True)
            params.update(change)
            t, _ = dispatch.select(spec, params, dict(B=128, H=16, HV=64, num_sms=132))
            assert (t["form"], t["pipe"]) == ("recurrent", 2), (T, change)


# ---- one variant per arithmetic: indexing modes and batch-invariant mode (issue 25) -----------------------

def _mode_grid():
    """gdn pool problems at T = 2..16 over both state dtypes, dims, batch sizes and head counts."""
    for T, sd, K, B, HV in itertools.product(range(2, 17), ["fp32", "bf16"], [64, 128, 256], [1, 4, 16, 64, 128, 512],
                                             [16, 32, 64]):
        yield dict(_GDN_BASE, layout="klast", K=K, V=K, T=T, state_dtype=sd, in_dtype="bf16", pool=True), \
            dict(B=B, H=16, HV=HV, num_sms=132)


def _tables():
    import json
    from pathlib import Path

    from gdnjit.tuned import SHIPPED_DIR, TunedTable

    return [(p.name, TunedTable(json.loads(Path(p).read_text())["entries"])) for p in sorted(SHIPPED_DIR.glob("*.json"))]


def test_ssm_scatter_and_dense_buffer_modes_get_the_same_variant():
    """Per-token stores through ssm_state_indices and through a dense intermediate buffer of the state's dtype
    (with or without the final writeback) compute alike, so the rules and every shipped tuned table must give
    them the same tunables: FlashInfer requires the two modes' outputs and states bit-identical."""
    spec = get_spec("gdn")
    tables = _tables()
    for base, facts in _mode_grid():
        dense = dict(base, inter_dtype=base["state_dtype"], ssm_idx_dtype="none")
        modes = [dense, dict(dense, update=False), dict(dense, same_pool=False),
                 dict(base, inter_dtype="none", ssm_idx_dtype="int32"),
                 dict(base, inter_dtype="none", ssm_idx_dtype="int64", idx_dtype="int64")]
        chosen = [dispatch.select(spec, m, facts)[0] for m in modes]
        assert all(c == chosen[0] for c in chosen), (facts, base, chosen)
        for name, table in tables:
            looked = [table.lookup("gdn", m, facts) for m in modes]
            assert all(x == looked[0] for x in looked), (name, facts, base, looked)


def test_one_token_varlen_calls_keep_the_native_lane_split():
    """vLLM's one-token varlen call dispatches as the native call of its shape (dispatch_params), then gdn.yaml's retile
    may change its rows per thread or per CTA and the L2 prefetch hint, nothing else (the per-row arithmetic, hence the
    bits, stay the native call's): over T = 1 shapes, state dtypes and batch regions, with the rules and each shipped
    tuned table. The retile fires where gdn.yaml says, nowhere else among these shapes: bf16 and fp32 state at
    B * HV * V 128 * 128 (bf16 at V = 64 too), fp32 from the half-head region to the pool rule's whole heads (B * HV
    192, 256 at V = 128), bf16 from B * HV 2048 at V = 128."""
    spec = get_spec("gdn")
    tables = [None] + [t for _, t in _tables()]
    fired = set()
    for (K, V), sd, B, HV in itertools.product([(128, 128), (64, 64), (256, 256)], ["fp32", "bf16"],
                                              [1, 2, 3, 4, 6, 8, 32, 512], [16, 32, 64]):
        native = dict(_GDN_BASE, layout="klast", K=K, V=V, T=1, state_dtype=sd, in_dtype="bf16", inter_dtype="none",
                      ssm_idx_dtype="none", pool=True)
        varlen = dict(native, varlen=True, bounded=True, null_slot="nonpositive")
        facts = dict(B=B, H=16, HV=HV, num_sms=132)
        for table in tables:
            looked = [None if table is None else table.lookup("gdn", p, facts) for p in (native, varlen)]
            (n, _), (v, _) = [dispatch.select(spec, p, facts, tuned=t) for p, t in zip((native, varlen), looked)]
            kept = [{k: x for k, x in t.items() if k not in spec.retile_may_set} for t in (n, v)]
            assert kept[0] == kept[1], (K, sd, B, HV, n, v)
            if v != n:
                fired.add((sd, V, B * HV))
    assert fired == {("bf16", 128, 128), ("bf16", 64, 256), ("bf16", 128, 2048),
                     ("bf16", 128, 8192), ("bf16", 128, 16384), ("bf16", 128, 32768), ("fp32", 128, 128),
                     ("fp32", 128, 192), ("fp32", 128, 256)}, fired


def test_a_pool_strided_inside_a_slot_runs_the_dense_pools_variant_unless_that_prefetches():
    """A pool strided inside a slot (FlashInfer's non-contiguous pools) dispatches as a dense one (dispatch_params), but
    its tiles are not one range, so a variant with the L2 prefetch is invalid for it: wherever the dense pool's choice
    (rules or a shipped tuned table) does not prefetch, the strided pool runs that very variant (the same bits); where
    it does, the strided pool takes the next valid choice, and that one sometimes splits the lanes otherwise
    (docs/api.md: its results then agree to rounding, not bit for bit)."""
    spec = get_spec("gdn")
    tables = [None] + [t for _, t in _tables()]
    other_lanes = same = 0
    for (K, V), sd, T, B, HV in itertools.product([(128, 128), (64, 64), (256, 256)], ["fp32", "bf16"],
                                                  [1, 2, 3, 4, 8, 16], [1, 3, 4, 8, 32, 128, 512], [16, 64]):
        dense = dict(_GDN_BASE, layout="klast", K=K, V=V, T=T, state_dtype=sd, in_dtype="bf16", inter_dtype="none",
                     ssm_idx_dtype="none", pool=True)
        strided = dict(dense, slot_strided=True)
        facts = dict(B=B, H=16, HV=HV, num_sms=132)
        for table in tables:
            looked = [None if table is None else table.lookup("gdn", p, facts) for p in (dense, strided)]
            (d, _), (s, _) = [dispatch.select(spec, p, facts, tuned=t) for p, t in zip((dense, strided), looked)]
            assert not s["l2_prefetch"], (K, sd, T, B, HV, s)
            if not d["l2_prefetch"]:
                assert s == d, (K, sd, T, B, HV, d, s)
                same += 1
            else:
                other_lanes += s["lanes_per_row"] != d["lanes_per_row"]
    assert same and other_lanes, (same, other_lanes)


def test_the_dispatch_view_maps_the_store_mode_and_the_index_flavour():
    spec = get_spec("gdn")
    p = dict(_GDN_BASE, layout="klast", K=128, V=128, T=4, state_dtype="bf16", in_dtype="bf16", pool=True,
             inter_dtype="none", ssm_idx_dtype="int64")
    assert spec.dispatch_view(p) == dict(p, inter_dtype="bf16", ssm_idx_dtype="none", update=False)
    assert spec.dispatch_view(dict(p, idx_dtype="int64", same_pool=False)) == spec.dispatch_view(p)
    plain = dict(p, ssm_idx_dtype="none")
    assert spec.dispatch_view(plain) == plain  # no per-token stores: the final writeback is the mode's own
    assert get_spec("nvfp4_quantize").dispatch_view({"K": 64}) == {"K": 64}


@pytest.mark.parametrize("with_tables", [False, True])
def test_batch_invariant_mode_picks_one_variant_for_every_batch(with_tables):
    """GDNJIT_BATCH_INVARIANT: the tunables (hence the arithmetic order) of a shape do not depend on B; without
    it they do somewhere (else the mode would be pointless)."""
    from gdnjit import runner

    spec = get_spec("gdn")
    tables = [t for _, t in _tables()] if with_tables else [None]
    varies = False
    for table in tables:
        for T, sd, HV in itertools.product([1, 2, 4, 8], ["fp32", "bf16"], [32, 64]):
            params = dict(_GDN_BASE, layout="klast", K=128, V=128, T=T, state_dtype=sd, in_dtype="bf16", pool=True,
                          inter_dtype="none", ssm_idx_dtype="none")
            per_b = [runner.choose_variant(spec, params, dict(B=B, H=16, HV=HV, num_sms=132), "sm_90", table,
                                           batch_invariant=True).tunables for B in (1, 3, 32, 128, 512, 4096)]
            assert all(x == per_b[0] for x in per_b), (T, sd, HV, per_b)
            normal = {runner.choose_variant(spec, params, dict(B=B, H=16, HV=HV, num_sms=132), "sm_90", table).tunables
                      for B in (1, 3, 32, 128, 512, 4096)}
            varies |= len(normal) > 1
    assert varies


def _plain_select(spec, params, facts, batch_invariant):
    """The dispatch contract read literally (module docstring), every condition evaluated whole by expr.evaluate:
    the reference the hoisted, compiled select_each must equal."""
    from gdnjit import expr

    seen = spec.dispatch_facts(facts, batch_invariant)
    context = {**spec.dispatch_view(params), **seen}
    for rule in spec.rules:
        if (rule.when is None or expr.evaluate(rule.when, context)) and spec.valid(params, dict(rule.use)):
            tunables = dict(rule.use)
            for r in spec.retile:
                if expr.evaluate(r.when, {**params, **tunables, **seen}):
                    changed = dict(tunables, **dict(r.use))
                    if spec.valid(params, changed):
                        return changed, rule
            return tunables, rule
    raise AssertionError(f"no rule for {params} {facts}")


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_select_each_equals_the_plain_contract(batch_invariant):
    """select_each (rules' fact-free conjuncts hoisted per params, conditions compiled into one Python expression,
    retile's params-only prefixes decided once) chooses what the plain reading of the contract chooses, for every
    call of the shipped shapes files on sm_90 (each known SM count) and sm_100a."""
    from gdnjit import shapes, warm

    n = retiled = 0
    for name in shapes.shipped_shapes():
        for prob in shapes.load_shapes(shapes.resolve_path(name)):
            spec = get_spec(prob.spec)
            for arch, varlen in itertools.product(("sm_90", "sm_100a"), (False, True)):
                params = shapes.params_for(prob, arch)
                if varlen:  # vLLM's one-token varlen decode: what the retile entries are for
                    if prob.spec != "gdn" or params["T"] != 1:
                        continue
                    params = dict(params, varlen=True, bounded=True, null_slot="nonpositive")
                facts = [{k: f[k] for k in spec.facts} for sms in warm.sm_counts_for(arch)
                         for f in shapes.iter_facts(prob, sms)]
                for f, chosen in zip(facts, dispatch.select_each(spec, params, facts, batch_invariant)):
                    want = _plain_select(spec, params, f, batch_invariant)
                    assert chosen == want, (params, f)
                    retiled += chosen[0] != dict(chosen[1].use)
                    n += 1
    assert n > 10000 and retiled > 0


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_select_each_equals_select_per_call(batch_invariant):
    """dispatch.select_each over a call's batch sizes (gdnjit warm's planner: the conjuncts that read no fact
    evaluated once for all) picks what select, one facts at a time, picks for every call in the shipped shapes files,
    sm_90 and sm_100a. (select is select_each of one facts: the comparison checks the hoisting, not two codes.)"""
    from gdnjit import shapes, warm

    n = 0
    for name in shapes.shipped_shapes():
        for prob in shapes.load_shapes(shapes.resolve_path(name)):
            spec = get_spec(prob.spec)
            for arch in ("sm_90", "sm_100a"):
                params = shapes.params_for(prob, arch)
                sms = warm.sm_counts_for(arch)[0]
                facts = [{k: f[k] for k in spec.facts} for f in shapes.iter_facts(prob, sms)]
                each = dispatch.select_each(spec, params, facts, batch_invariant)
                assert len(each) == len(facts)
                for f, chosen in zip(facts, each):
                    assert chosen == dispatch.select(spec, params, f, batch_invariant=batch_invariant), (params, f)
                    n += 1
    assert n > 1000
