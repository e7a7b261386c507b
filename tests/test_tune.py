"""``gdnjit tune``'s candidate selection (CPU): ``--where`` narrows the valid choices, the rules' choices
are always measured, and a bad expression is refused before anything is compiled."""

from __future__ import annotations

import contextlib
import io

from gdnjit import cli, dispatch
from gdnjit.spec import get_spec
from gdnjit.tune import candidate_tunables
from gdnjit.gdn import NATIVE_CONVENTIONS

SPEC = get_spec("gdn")
PARAMS = dict(layout="klast", K=128, V=128, T=4, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32",
              dtb_dtype="fp32", pool=True, idx_dtype="int32", same_pool=True, inter_dtype="none",
              ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS)
FACTS = {"B": 512, "H": 16, "HV": 64, "num_sms": 132}


def test_all_valid_choices_without_where():
    got = candidate_tunables(SPEC, PARAMS, None, [])
    valid = [t for t in SPEC.all_tunable_choices() if not SPEC.violations(PARAMS, t)]
    assert got == valid and len(got) > 100
    assert {t["form"] for t in got} == {"recurrent", "chunk", "mma", "tc"} and {t["pipe"] for t in got} == {1, 2, 4, 8}


def test_where_narrows_and_rules_choice_is_kept():
    rule, _ = dispatch.select(SPEC, PARAMS, FACTS)
    got = candidate_tunables(SPEC, PARAMS, "form == 'mma' and tile_v == 64", [rule])
    mma = [t for t in got if t["form"] == "mma"]
    assert mma and all(t["tile_v"] == 64 for t in mma)
    assert got[-1] == rule and rule["form"] == "tc"  # outside the where, measured alongside for the comparison
    assert all(not SPEC.violations(PARAMS, t) for t in got)
    # where may name params too; a rule choice already selected is not repeated
    same = candidate_tunables(SPEC, PARAMS, "T == 4 and form in ('tc', 'recurrent')", [rule])
    assert same.count(rule) == 1 and {t["form"] for t in same} == {"tc", "recurrent"}


def test_bad_where_is_refused_before_any_work():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["tune", "--shapes", "tools/bench_shapes.yaml", "--where", "form == ("])
    assert rc == 2 and "--where" in err.getvalue() and "syntax error" in err.getvalue()


def test_where_names_and_shapes_are_checked_before_the_gpu():
    """A --where name that is neither a param nor a tunable of the shapes' specs, a --call the shapes files do not have
    or a shapes file that does not load is refused (one line, status 2) before the GPU checks: on a machine without a
    GPU too."""
    for argv, want in (
            (["--shapes", "tools/bench_shapes.yaml", "--where", "bogus == 1 and form == 'tc'"],
             "gdnjit tune: --where: expected names of spec gdn's params and tunables, got unknown ['bogus']"),
            # qwen35.yaml also has conv and nvfp4 calls, which have no `form`; --call keeps the gdn ones
            (["--shapes", "qwen35.yaml", "--where", "form == 'tc'"],
             "gdnjit tune: --where: expected names of spec causal_conv1d_update's params and tunables, got unknown "
             "['form'] (--call narrows the shapes' calls)"),
            (["--shapes", "qwen35.yaml", "--call", "decode", "--where", "form == 'tc'"], "gdnjit tune: needs a CUDA GPU"),
            (["--shapes", "qwen35.yaml", "--call", "mtp"], "gdnjit tune: --call: expected calls of the shapes files "
             "(conv_decode, conv_verify, decode, lazy_decode, lazy_decode_bf16, lazy_fold, lazy_fold_bf16, "
             "lazy_fold_prep, lazy_fold_prep_bf16, lazy_prep, lazy_prep_bf16, lazy_spec, lazy_spec_bf16, "
             "nvfp4_activations, replayssm_commit, replayssm_verify, spec_flush, spec_step, verify_bf16, verify_fp32), "
             "got unknown ['mtp']"),
            # the lazy state's steps are tuned (as steps over fold cycles); its prep, fold and reset calls are skipped
            # (a line says why once tuning starts)
            (["--shapes", "qwen35.yaml", "--call", "lazy_decode"], "gdnjit tune: needs a CUDA GPU"),
            (["--shapes", "qwen35.yaml", "--call", "lazy_prep", "--call", "lazy_fold"], "gdnjit tune: --call: no call "
             "left to tune (lazy_fold: a fold or a reset keeps the rules' choice (its time is that of the rings it "
             "empties); lazy_prep: a prep launch is timed with its step (its window the step's))\n"),
            (["--shapes", "qwen35.yaml", "--call", "lazy_spec", "--call", "decode"], "gdnjit tune: needs a CUDA GPU"),
            (["--shapes", "nope.yaml"], "gdnjit tune: shapes: no file 'nope.yaml'")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = cli.main(["tune", *argv])
        assert rc == 2 and err.getvalue().startswith(want), err.getvalue()
