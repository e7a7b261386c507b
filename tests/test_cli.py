"""The ``gdnjit`` command line, in-process (``gdnjit.cli.main``) with the cache in a temp dir,
plus one fresh-interpreter run to time a fully cached ``warm``."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from gdnjit import cli
from gdnjit.cache.archive import export_archive
from gdnjit.cache.store import ENTRY_DIR, DiskCache
from gdnjit.config import load_config, set_config
from gdnjit.shapes import SHAPES_DIR, load_shapes
from gdnjit.warm import plan

REPO = Path(__file__).resolve().parents[1]
WARM = ["warm", "--shapes", "qwen35.yaml", "--arch", "sm_90"]


def _clean_env(mp: pytest.MonkeyPatch, cache_dir: Path) -> None:
    for name in list(os.environ):
        if name.startswith("GDNJIT_"):
            mp.delenv(name)
    mp.setenv("GDNJIT_CACHE_DIR", str(cache_dir))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``gdnjit.cli.main(argv)`` run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def entries(cache_dir: Path, suffix: str) -> list[Path]:
    d = cache_dir / ENTRY_DIR
    return sorted(d.glob(f"*{suffix}")) if d.is_dir() else []


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """GDNJIT_CACHE_DIR -> a fresh temp dir; the process-wide config re-read before and after."""
    d = tmp_path / "cache"
    _clean_env(monkeypatch, d)
    set_config(None)
    yield d
    set_config(None)


@pytest.fixture(scope="module")
def planned():
    """What warm must compile: the rules' choices plus the shipped tuned tables' (gdnjit/tuned/)."""
    from gdnjit.config import load_config
    from gdnjit.warm import tuned_docs

    docs = tuned_docs(load_config({"GDNJIT_CACHE_DIR": "/nonexistent-gdnjit-test"}))
    return plan(load_shapes("qwen35.yaml"), ["sm_90"], tuned=docs)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory, planned):
    """One real ``warm -j 2`` of qwen35.yaml into a module-wide cache dir (tests copy it)."""
    d = tmp_path_factory.mktemp("warmed") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        _clean_env(mp, d)
        set_config(None)
        try:
            t0 = time.perf_counter()
            rc, out, err = run_cli([*WARM, "-j", "2"])
            elapsed = time.perf_counter() - t0
        finally:
            set_config(None)
    return d, rc, out, err, elapsed


@pytest.fixture
def warm_copy(warmed, cache_dir):
    """A private copy of the warmed cache at this test's GDNJIT_CACHE_DIR."""
    shutil.copytree(warmed[0], cache_dir)
    return cache_dir


# ---- warm ---------------------------------------------------------------------------------------


def test_warm_dry_run(cache_dir, planned):
    rc, out, err = run_cli([*WARM, "--dry-run"])
    assert rc == 0, err
    lines = out.strip().splitlines()
    n = len(planned)
    assert n > 0
    assert len(lines) == n + 1
    assert lines[-1] == f"{n} variants for {len(load_shapes('qwen35.yaml'))} problems on sm_90"
    assert [line.split()[0] for line in lines[:-1]] == [v.name for v in planned]
    assert all(v.describe() in line for v, line in zip(planned, lines))
    # nothing compiled, nothing written
    assert entries(cache_dir, ".cubin") == [] and entries(cache_dir, ".json") == []


def test_plan_lists_each_variant_once(planned):
    """A tuned table's choice equal to a rule's (tunables in another key order) is one variant."""
    from gdnjit.cache import cache_key

    assert len({cache_key(v.key_fields) for v in planned}) == len(planned)


def test_plan_retiles_a_tuned_entry_as_dispatch_does(tmp_path):
    """A tuned entry's choice goes through the spec's retile in warm.plan as in dispatch.select: vLLM's one-token
    varlen bf16 decode at B * HV 128 plans only the one-row-per-thread variant, from the rules and from a table entry
    of the native call (both 4-lane 2-row choices)."""
    from gdnjit import dispatch
    from gdnjit.spec import get_spec

    text = (SHAPES_DIR / "qwen35.yaml").read_text()
    head = text[:text.index("models:")]
    defaults = text[text.index("defaults:"):text.index("calls:")]
    (tmp_path / "v.yaml").write_text(head + "models:\n  m: {H: 16, HV: 32, K: 128, V: 128, hidden: 2048, "
                                     "intermediate: 512}\ntp: [1]\nbatch_sizes: [4]\n" + defaults + "calls:\n"
                                     "  - name: varlen_decode\n    spec: gdn\n    params: {layout: klast, T: 1, "
                                     "state_dtype: bf16, pool: true, varlen: true, bounded: true, null_slot: "
                                     "nonpositive}\n")
    problems = [p for p in load_shapes(tmp_path / "v.yaml") if p.spec == "gdn"]
    assert len(problems) == 1
    spec = get_spec("gdn")
    params = dict(problems[0].params)
    native = dict(params, varlen=False, bounded=False, null_slot="negative")
    rule = dispatch.select(spec, native, dict(B=4, H=16, HV=32, num_sms=132))[0]
    assert (rule["lanes_per_row"], rule["ilp"], rule["tile_v"]) == (4, 2, 32)
    doc = {"arch": "sm_90", "entries": [{"spec": "gdn", "params": native, "facts": {"B": 4, "H": 16, "HV": 32},
                                         "tunables": dict(rule, l2_prefetch=False)}]}
    planned = [v for v in plan(problems, ["sm_90"], num_sms=[132], tuned=[doc]) if v.spec.name == "gdn"]
    assert sorted((dict(v.tunables)["ilp"], dict(v.tunables)["l2_prefetch"]) for v in planned) == [(1, False), (1, True)]


def test_plan_has_each_rows_form_steps_prep():
    """A rows-form step launches its prep first (gdn_lazy.yaml's first_launch), so the plan has that prep variant with
    the step's window: the rules' fp32 speculative steps of T 2 / 3 (rows form from B * HV 2048; their preps are in
    no shapes call), and a tuned table's rows-form step with window 8 (the rules' prep has 16)."""
    from gdnjit import dispatch
    from gdnjit.spec import get_spec

    problems = [p for p in load_shapes(SHAPES_DIR / "qwen35.yaml") if p.call == "lazy_spec"]
    spec = get_spec("gdn_lazy")

    def preps(variants):
        return {(dict(v.params)["T"], dict(v.tunables)["window"]) for v in variants if dict(v.params)["mode"] == "prep"}

    planned = plan(problems, ["sm_90"], num_sms=[132])
    rows = {(dict(v.params)["T"], dict(v.tunables)["window"]) for v in planned if dict(v.tunables)["form"] == "rows"
            and dict(v.params)["mode"] == "step"}
    assert {T for T, _ in rows} == {2, 3} and preps(planned) == rows
    p2 = next(p for p in problems if dict(p.params)["T"] == 2 and dict(p.facts)["HV"] == 64)
    params = dict(spec.param_defaults, **dict(p2.params))
    rule = dispatch.select(spec, params, dict(p2.facts, B=512, num_sms=132))[0]
    assert rule["form"] == "rows" and rule["window"] == 16
    doc = {"arch": "sm_90", "entries": [{"spec": "gdn_lazy", "params": params, "facts": dict(p2.facts, B=512),
                                         "tunables": dict(rule, window=8)}]}
    assert (2, 8) in preps(plan(problems, ["sm_90"], num_sms=[132], tuned=[doc])) and (2, 8) not in preps(planned)
    # one rows-form variant of plain steps at B 64 and 512 launches preps of 4 and 1 warps an item (by B * H): both
    decode = [p for p in load_shapes(SHAPES_DIR / "qwen35.yaml") if p.call == "lazy_decode" and dict(p.facts)["H"] == 16]
    decode = [dataclasses.replace(p, batch_sizes=(64, 512)) for p in decode[:1]]
    planned = plan(decode, ["sm_90"], num_sms=[132])
    assert len({v.tunables for v in planned if dict(v.params)["mode"] == "step"}) == 1
    assert {dict(v.tunables)["head_warps"] for v in planned if dict(v.params)["mode"] == "prep"} == {1, 4}


def test_warm_compiles_every_planned_variant(warmed, planned):
    d, rc, out, err, elapsed = warmed
    n = len(planned)
    assert rc == 0, out + err
    assert f"gdnjit warm: {n} variants ({n} compiled, 0 already cached, 0 failed)" in out
    assert "0 with spills" in out
    assert f"cache {d}" in out
    # one progress line per compiled variant (stderr is not a tty here)
    assert len([line for line in err.splitlines() if " compiled " in line]) == n
    names = {v.name for v in planned}
    assert {p.stem for p in entries(d, ".cubin")} == names
    assert {p.stem for p in entries(d, ".json")} == names
    for p in entries(d, ".json"):
        meta = json.loads(p.read_text())
        assert meta["spill_bytes"] == 0, (p.name, meta)
        assert meta["stack_bytes"] == 0, (p.name, meta)
        assert meta["registers"] > 0
        assert meta["warnings"] == []
        assert meta["cubin_size"] == (p.with_suffix(".cubin")).stat().st_size
        assert meta["fields"]["arch"] == "sm_90"
    print(f"\nwarm -j 2 of {n} variants: {elapsed:.1f} s")


def test_second_warm_compiles_nothing(warm_copy, planned):
    n = len(planned)
    before = {p.name: p.stat().st_mtime_ns for p in (warm_copy / ENTRY_DIR).iterdir()}
    rc, out, err = run_cli([*WARM, "-j", "2"])
    assert rc == 0, err
    assert f"gdnjit warm: {n} variants (0 compiled, {n} already cached, 0 failed)" in out
    assert err == ""  # cached results are not reported without -v
    after = {p.name: p.stat().st_mtime_ns for p in (warm_copy / ENTRY_DIR).iterdir()}
    assert after == before


def test_second_warm_verbose_table(warm_copy, planned):
    rc, out, err = run_cli([*WARM, "-v"])
    assert rc == 0
    rows = [line for line in out.splitlines() if line.startswith("cached ")]
    assert len(rows) == len(planned)
    assert len([line for line in err.splitlines() if " cached " in line]) == len(planned)


def test_second_warm_takes_the_recorded_plan(warm_copy, planned, monkeypatch):
    """A warm that finds its plan recorded and every recorded variant cached plans nothing; --dry-run lists the record
    as the planner would. The first warm (the fixture's) wrote one record."""
    import gdnjit.warm

    assert len(list((warm_copy / "plans").glob("*.json"))) == 1
    monkeypatch.setattr(gdnjit.warm, "plan", lambda *a, **k: pytest.fail("planned despite the record"))
    n = len(planned)
    rc, out, err = run_cli([*WARM, "-v"])
    assert rc == 0, err
    assert f"gdnjit warm: {n} variants (0 compiled, {n} already cached, 0 failed)" in out
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("cached ")] == [v.name for v in planned]
    rc, out, err = run_cli([*WARM, "--dry-run"])
    assert rc == 0, err
    assert out.splitlines() == [f"{v.name}  {v.describe()}" for v in planned] + [
        f"{n} variants for {len(load_shapes('qwen35.yaml'))} problems on sm_90"]


def test_warm_plans_again_when_a_recorded_entry_is_gone_or_an_input_changed(warm_copy, planned, monkeypatch):
    """The record only shortens the all-cached check: a missing entry (or a changed input: another key) plans and
    compiles what is missing, and records again."""
    import gdnjit.warm

    calls = []
    real_plan = gdnjit.warm.plan
    monkeypatch.setattr(gdnjit.warm, "plan", lambda *a, **k: calls.append(1) or real_plan(*a, **k))
    (warm_copy / ENTRY_DIR / f"{planned[3].name}.json").unlink()
    n = len(planned)
    rc, out, err = run_cli(WARM)
    assert rc == 0, err
    assert calls == [1] and f"gdnjit warm: {n} variants (1 compiled, {n - 1} already cached, 0 failed)" in out
    rc, out, err = run_cli(WARM)
    assert rc == 0 and calls == [1] and f"(0 compiled, {n} already cached" in out
    rc, out, err = run_cli([*WARM, "--num-sms", "132"])  # another input: another record
    assert rc == 0 and calls == [1, 1]
    assert len(list((warm_copy / "plans").glob("*.json"))) == 2


def test_second_warm_subprocess_is_fast(warm_copy, planned):
    """A cached warm in a fresh process (a container's start): the first warm's recorded plan and its (240) verified
    lookups, no planning (~0.3 s on the dev CPU; planning alone took 1-3 s: docs/perf.md v34, v52)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env["GDNJIT_CACHE_DIR"] = str(warm_copy)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    n = len(planned)
    times = []
    for _ in range(2):  # best of two: the first may pay for cold file-system caches
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gdnjit.cli", *WARM], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        times.append(time.perf_counter() - t0)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"gdnjit warm: {n} variants (0 compiled, {n} already cached, 0 failed)" in proc.stdout
        if times[-1] < 2.0:
            break
    assert min(times) < 2.0, f"cached warm took {times} s"


def test_warm_bad_inputs(cache_dir, monkeypatch, tmp_path):
    rc, out, err = run_cli(["warm", "--shapes", "nope.yaml", "--arch", "sm_90"])
    assert rc == 2
    assert "gdnjit warm:" in err and "no file 'nope.yaml'" in err
    rc, _, err = run_cli_exit(["warm", "--shapes", "qwen35.yaml", "--arch", "sm90"])
    assert rc == 2 and "argument --arch" in err and "got 'sm90'" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text((Path(cli.__file__).parent / "shapes" / "qwen35.yaml").read_text() + "bogus: 1\n")
    rc, _, err = run_cli(["warm", "--shapes", str(bad), "--arch", "sm_90"])
    assert rc == 2 and str(bad) in err and "bogus" in err
    monkeypatch.setattr(cli, "_local_arch", lambda: None)
    rc, _, err = run_cli(["warm", "--shapes", "qwen35.yaml"])
    assert rc == 2 and "pass --arch" in err
    assert entries(cache_dir, ".cubin") == []


# ---- cache ls / verify / clear --------------------------------------------------------------------


def test_cache_ls(warm_copy, planned):
    rc, out, _ = run_cli(["cache", "ls"])
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == len(planned)
    assert all(line.startswith("rw ") and "spills=0" in line and "regs=" in line for line in lines)
    assert {line.split()[1] for line in lines} == {v.name for v in planned}
    rc, out, _ = run_cli(["cache", "ls", "-v"])
    assert rc == 0 and len(out.strip().splitlines()) == 2 * len(planned)


def test_cache_verify_corrupt_and_repair(warm_copy, planned):
    n = len(planned)
    rc, out, _ = run_cli(["cache", "verify"])
    assert rc == 0
    assert out.strip() == f"{n} entries checked in {warm_copy / ENTRY_DIR}, 0 bad"

    victim = entries(warm_copy, ".cubin")[3]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    victim.write_bytes(bytes(data))
    rc, out, _ = run_cli(["cache", "verify"])
    assert rc == 1
    bad = [line for line in out.splitlines() if line.startswith("BAD ")]
    assert bad == [f"BAD {victim.stem}: {victim.name}: size or sha256 does not match the sidecar (truncated or corrupt)"]
    assert out.strip().endswith(f"{n} entries checked in {warm_copy / ENTRY_DIR}, 1 bad")
    assert victim.exists()  # verify alone deletes nothing

    rc, out, _ = run_cli(["cache", "verify", "--repair"])
    assert rc == 0
    assert f"BAD {victim.stem}: " in out and "(removed)" in out
    assert not victim.exists() and not victim.with_suffix(".json").exists()
    rc, out, _ = run_cli(["cache", "verify"])
    assert rc == 0 and out.strip() == f"{n - 1} entries checked in {warm_copy / ENTRY_DIR}, 0 bad"

    # a warm puts back exactly the removed entry
    rc, out, _ = run_cli([*WARM, "-j", "2"])
    assert rc == 0 and f"({1} compiled, {n - 1} already cached, 0 failed)" in out
    assert victim.exists()


def test_cache_verify_bad_sidecar_and_orphan(warm_copy):
    sidecars = entries(warm_copy, ".json")
    sidecars[0].write_text("{not json")
    sidecars[1].unlink()  # orphan cubin
    rc, out, _ = run_cli(["cache", "verify"])
    assert rc == 1
    bad = sorted(line for line in out.splitlines() if line.startswith("BAD "))
    assert bad == sorted(f"BAD {p.stem}: missing or unreadable sidecar" for p in sidecars[:2])
    rc, out, _ = run_cli(["cache", "verify", "--repair"])
    assert rc == 0
    assert not sidecars[0].exists() and not sidecars[1].with_suffix(".cubin").exists()
    rc, _, _ = run_cli(["cache", "verify"])
    assert rc == 0


def test_cache_clear(warm_copy, planned):
    n = len(planned)
    rc, out, _ = run_cli(["cache", "clear"])
    assert rc == 0
    assert out.strip().splitlines() == [f"removed {2 * n} files from {warm_copy / ENTRY_DIR}",
                                        f"removed 1 files from {warm_copy / 'plans'}"]
    assert list((warm_copy / ENTRY_DIR).iterdir()) == [] and list((warm_copy / "plans").iterdir()) == []
    rc, out, _ = run_cli(["cache", "ls"])
    assert rc == 0 and out == ""
    rc, out, _ = run_cli(["cache", "verify"])
    assert rc == 0 and "0 entries checked" in out


def test_cache_on_empty_dir(cache_dir):
    for action in ("ls", "verify", "clear"):
        rc, _, _ = run_cli(["cache", action])
        assert rc == 0
    assert not (cache_dir / ENTRY_DIR).exists() or list((cache_dir / ENTRY_DIR).iterdir()) == []


# ---- render / list / spec ---------------------------------------------------------------------


def test_render(cache_dir):
    rc, out, err = run_cli(["render", "gdn", "-p", "layout=kmajor"])
    assert rc == 0, err
    assert 'extern "C"' in out and "gdn_step(const Args p)" in out
    assert "layout=kmajor" in out
    assert out.startswith("// gdnjit: gated delta rule step over T tokens, recurrent form (gdn_recurrent.cu.j2).")
    assert entries(cache_dir, ".cubin") == []  # rendering compiles nothing
    # the form picks the template: gdn_{form}.cu.j2
    rc, out, err = run_cli(["render", "gdn", "-p", "T=4", "-t", "form=mma", "-t", "lanes_per_row=4", "-t", "ilp=1",
                            "-t", "tile_v=32", "-t", "stage=true", "-t", "pipe=1"])
    assert rc == 0, err
    assert "mma form (gdn_mma.cu.j2)" in out.splitlines()[0] and "form=mma" in out


def test_render_params_and_tunables(cache_dir):
    rc, out, err = run_cli(["render", "gdn", "-p", "K=64", "-p", "V=64", "-t", "tile_v=16", "--B", "512"])
    assert rc == 0, err
    assert "K=64 V=64" in out and "tile_v=16" in out and "constexpr int TILE_V = 16;" in out


def test_render_bad_input(cache_dir):
    rc, out, err = run_cli(["render", "gdn", "-p", "bogus=1"])
    assert rc == 2 and out == ""
    assert err.strip() == ("gdnjit render: --param: expected params of spec gdn (layout, K, V, T, in_dtype, "
                           "out_dtype, state_dtype, dtb_dtype, pool, idx_dtype, same_pool, inter_dtype, "
                           "ssm_idx_dtype, update, l2norm, slot_strided, varlen, bounded, accepted, tree, "
                           "inter_indexed, null_slot, "
                           "padding, gates, replay_cache, replay, track, fused_step, write_once), got unknown ['bogus']")
    rc, out, err = run_cli(["render", "gdn", "-p", "layout"])
    assert rc == 2 and err.strip() == "gdnjit render: --param: expected NAME=VALUE, got 'layout'"
    rc, _, err = run_cli(["render", "gdn", "-p", "K=96"])
    assert rc == 2 and "K" in err and "96" in err
    rc, _, err = run_cli(["render", "nope"])
    assert rc == 2 and "no shipped spec 'nope'" in err


def test_list(cache_dir):
    rc, out, _ = run_cli(["list", "-v"])  # the detail; the default summary: test_list_is_a_short_summary
    assert rc == 0
    assert ("spec gdn (template gdn_{form}.cu.j2 (form=recurrent: gdn_recurrent.cu.j2, form=chunk: gdn_chunk.cu.j2, "
            "form=mma: gdn_mma.cu.j2, form=tc: gdn_tc.cu.j2))") in out
    assert ("spec nvfp4_quantize (template nvfp4_{scale}.cu.j2 (scale=tensor: nvfp4_tensor.cu.j2, "
            "scale=token: nvfp4_token.cu.j2))") in out
    assert "  param   layout: ['klast', 'kmajor']" in out
    assert "  tunable lanes_per_row: " in out
    assert "  rule 0: when " in out
    assert "shapes files: qwen35.yaml, qwen3_next.yaml" in out
    assert f"cached variants in {cache_dir / ENTRY_DIR}: 0" in out


def test_spec_validate(cache_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    rc, out, _ = run_cli(["spec", "validate", "gdnjit/specs/gdn.yaml"])
    assert rc == 0
    assert out.startswith("gdnjit/specs/gdn.yaml: ok (spec gdn: ")
    rc, out, _ = run_cli(["spec", "validate", "gdn"])
    assert rc == 0 and out.startswith("gdn: ok (spec gdn: ")
    bad = tmp_path / "bad.yaml"
    text = (REPO / "gdnjit/specs/gdn.yaml").read_text()
    assert 'template: "gdn_{form}.cu.j2"' in text
    bad.write_text(text.replace('template: "gdn_{form}.cu.j2"', "template: x.j2"))
    rc, _, err = run_cli(["spec", "validate", str(bad)])
    assert rc == 2 and f"{bad}:" in err and "template" in err
    bad.write_text(text.replace('template: "gdn_{form}.cu.j2"', 'template: "gdn_{layout}.cu.j2"'))
    rc, _, err = run_cli(["spec", "validate", str(bad)])
    assert rc == 2 and f"{bad}:" in err and "no template named 'gdn_klast.cu.j2' (for layout='klast')" in err


def test_spec_show(cache_dir):
    rc, out, _ = run_cli(["spec", "show", "gdn", "--B", "1"])
    assert rc == 0
    assert out.startswith("spec gdn: ")
    assert "rule 0 (line " in out
    chosen = [line for line in out.splitlines() if "CHOSEN" in line]
    assert len(chosen) == 1 and chosen[0].startswith("  rule ")
    assert "template: gdn_{form}.cu.j2 (form=recurrent: gdn_recurrent.cu.j2, " in out
    assert "  template of the chosen variant: gdn_recurrent.cu.j2" in out.splitlines()
    rc, out, _ = run_cli(["spec", "show", "gdn"])
    assert rc == 0 and "CHOSEN" not in out and "template of the chosen variant" not in out
    rc, out, _ = run_cli(["spec", "show", "gdn", "--B", "512", "--HV", "64", "-p", "K=128", "-p", "T=8",
                              "-p", "state_dtype=bf16"])
    assert rc == 0 and "  template of the chosen variant: gdn_tc.cu.j2" in out.splitlines()
    rc, out, _ = run_cli(["spec", "show", "gdn", "-p", "layout=kmajor", "-p", "K=256", "-p", "state_dtype=bf16"])
    assert rc == 0 and "CHOSEN" in out


def test_spec_show_and_render_refuse_params_and_tunables_the_spec_does_not_allow(cache_dir):
    """A -p value outside the param's allowed values (or of another type: 1 for a bool) is one line, status 2, before
    any output: the rules are never explained for a call the op would refuse; render's -t likewise."""
    for cmd in (["spec", "show"], ["render"]):
        prog = f"gdnjit {cmd[0]}"
        rc, out, err = run_cli([*cmd, "gdn", "-p", "T=99"])
        assert (rc, out) == (2, "")
        assert err.strip() == (f"{prog}: --param T: expected one of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, "
                               f"16], got 99")
        rc, out, err = run_cli([*cmd, "gdn", "-p", "pool=1"])
        assert (rc, out) == (2, "") and err.strip() == f"{prog}: --param pool: expected one of [False, True], got 1"
        rc, out, err = run_cli([*cmd, "gdn", "-p", "layout=kfirst"])
        assert (rc, out) == (2, "")
        assert err.strip() == f"{prog}: --param layout: expected one of ['klast', 'kmajor'], got 'kfirst'"
        rc, out, err = run_cli([*cmd, "gdn", "-p", "bogus=1"])
        assert (rc, out) == (2, "") and err.strip().endswith("got unknown ['bogus']")
        # a param with a domain beyond its list (nvfp4's K: any multiple of 16) names the domain too
        rc, out, err = run_cli([*cmd, "nvfp4_quantize", "-p", "K=7681", "-f", "M=8"])
        assert (rc, out) == (2, "") and err.startswith(f"{prog}: --param K: expected one of [16, 32, ")
        assert err.strip().endswith("or an integer with K % 16 == 0 and 16 <= K <= 1048576, got 7681")
    # render's -t: a name the spec does not have, or a value it does not allow, likewise (an unknown name was ignored)
    rc, out, err = run_cli(["render", "gdn", "-t", "nope=1"])
    assert (rc, out) == (2, "") and err.strip() == ("gdnjit render: --tunable: expected tunables of spec gdn (lanes_per_row, "
                                                    "ilp, tile_v, stage, form, pipe, k_warps, l2_prefetch), got unknown "
                                                    "['nope']")
    rc, out, err = run_cli(["render", "gdn", "-t", "form=bogus"])
    assert (rc, out) == (2, "")
    assert err.strip() == "gdnjit render: --tunable form: expected one of ['recurrent', 'chunk', 'mma', 'tc'], got 'bogus'"
    rc, out, err = run_cli(["render", "gdn", "-t", "stage=1"])
    assert (rc, out) == (2, "") and err.strip() == "gdnjit render: --tunable stage: expected one of [False, True], got 1"


def test_usage_errors(cache_dir):
    with pytest.raises(SystemExit) as ei:
        run_cli([])
    assert ei.value.code == 2
    with pytest.raises(SystemExit) as ei:
        run_cli(["cache", "frobnicate"])
    assert ei.value.code == 2


# ---- bad input: one line on stderr naming the problem, status 2, no traceback, nothing written --------


def run_cli_exit(argv: list[str]) -> tuple[int, str, str]:
    """``run_cli``, with argparse's SystemExit (usage errors) turned into the exit status; the process-wide
    config is re-read first (tests set GDNJIT_* variables after the ``cache_dir`` fixture ran)."""
    set_config(None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def tree(root: Path):
    """What is at ``root``: None if nothing; the bytes of a file; else {relative path: (mode, bytes or None)}."""
    if not os.path.lexists(root):
        return None
    if not root.is_dir():
        return root.read_bytes()
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def bad_input(argv: list[str], root: Path, *needles: str, status: int = 2) -> str:
    """Run ``argv``; assert: ``status``, nothing on stdout, exactly one line on stderr containing each of
    ``needles``, no traceback, and ``root`` (the cache dir) unchanged. Returns the line."""
    before = tree(root)
    rc, out, err = run_cli_exit(argv)
    assert "Traceback" not in out + err
    assert rc == status, (rc, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert tree(root) == before
    return lines[0]


def _fields(i: int) -> dict:
    return {"format": 1, "gdnjit_version": "t", "spec": "s", "template": "t", "template_hash": "h",
            "kernel_name": "k", "params": {"i": i}, "tunables": {}, "arch": "sm_90", "nvrtc_version": "13.0",
            "options": [], "args": [], "values": {}}


def seed_cache(root: Path, n: int) -> list[str]:
    """``n`` small valid entries in the cache at ``root`` (no compiler involved); their names."""
    from gdnjit.cache import cache_key
    from gdnjit.cache.store import Built, DiskCache
    from gdnjit.config import load_config

    cache = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(root)}))
    names = []
    for i in range(n):
        f = _fields(i)
        name = f"e{i}-{cache_key(f)[:32]}"
        cache.get_or_build(name, f, lambda i=i: Built(bytes([i + 1]) * 64, {"registers": 1, "spill_bytes": 0}))
        names.append(name)
    return names


def make_unwritable(d: Path, monkeypatch) -> str:
    """Make ``d`` unwritable and return the error text expected. A normal user: chmod a-w on it and its
    dirs. Root ignores permission bits (the chmod'ed dir stays writable for it), so there creating a file
    under ``d`` fails as on a read-only file system instead (EROFS from tempfile.mkstemp, which the
    cache's write check uses); either way the check must turn it into one line."""
    dirs = [d, *(p for p in d.rglob("*") if p.is_dir())]
    for p in dirs:
        p.chmod(0o555)
    try:
        (d / ".probe").touch()
    except PermissionError:
        return "Permission denied"
    (d / ".probe").unlink()
    real = tempfile.mkstemp
    top = d.resolve()

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and (Path(dir).resolve() == top or top in Path(dir).resolve().parents):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return os.strerror(errno.EROFS)


@pytest.fixture
def readonly_cache(cache_dir, monkeypatch):
    """The test's cache dir with two entries, then made unwritable; (dir, expected OS error text)."""
    seed_cache(cache_dir, 2)
    why = make_unwritable(cache_dir, monkeypatch)
    yield cache_dir, why
    for p in [cache_dir, *(p for p in cache_dir.rglob("*") if p.is_dir())]:
        p.chmod(0o755)


@pytest.mark.parametrize("argv", [
    [*WARM, "-j", "1"],
    ["cache", "clear"],
    ["cache", "verify", "--repair"],
    ["cache", "evict", "--max-bytes", "1"],
    ["cache", "import", "ARCHIVE"],
], ids=["warm", "clear", "verify-repair", "evict", "import"])
def test_readonly_cache_dir(readonly_cache, tmp_path, argv):
    d, why = readonly_cache
    archive = tmp_path / "other.tar.gz"
    if "ARCHIVE" in argv:  # a good archive: only the cache dir is wrong
        from gdnjit.cache.store import DiskCache
        from gdnjit.config import load_config

        seed_cache(tmp_path / "other", 3)
        export_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "other")})), archive)
    argv = [str(archive) if a == "ARCHIVE" else a for a in argv]
    line = bad_input(argv, d, f"gdnjit {argv[0]}: GDNJIT_CACHE_DIR: expected a writable directory, got '{d}'", why)
    assert line == (f"gdnjit {argv[0]}: GDNJIT_CACHE_DIR: expected a writable directory, got '{d}' "
                    f"(cannot create a file in it: {why})")


def test_readonly_cache_dir_dry_run_still_works(readonly_cache):
    d, _ = readonly_cache
    before = tree(d)
    rc, out, err = run_cli_exit([*WARM, "--dry-run"])
    assert rc == 0 and err == "" and out.strip().endswith("on sm_90")
    assert tree(d) == before


@pytest.mark.parametrize("argv", [
    WARM, [*WARM, "--dry-run"], ["cache", "ls"], ["cache", "verify"], ["cache", "clear"], ["list"],
    ["cache", "export", "OUT"],
], ids=["warm", "warm-dry-run", "ls", "verify", "clear", "list", "export"])
@pytest.mark.parametrize("under", [False, True], ids=["file", "under-a-file"])
def test_cache_dir_is_a_regular_file(tmp_path, monkeypatch, argv, under):
    f = tmp_path / "cachefile"
    f.write_text("not a directory\n")
    d = f / "cache" if under else f
    _clean_env(monkeypatch, d)
    argv = [str(tmp_path / "x.tar.gz") if a == "OUT" else a for a in argv]
    problem = f"it lies under '{f}', which is not a directory" if under else "it is not a directory"
    line = bad_input(argv, f, f"GDNJIT_CACHE_DIR: expected a directory, got '{d}'")
    assert line == f"gdnjit {argv[0]}: GDNJIT_CACHE_DIR: expected a directory, got '{d}' ({problem})"
    assert not (tmp_path / "x.tar.gz").exists()


def _not_gzip(p: Path) -> None:
    p.write_text("this is not an archive\n")


def _plain_tar(p: Path) -> None:  # a tar, but not gzipped
    with tarfile.open(p, "w") as tar:
        info = tarfile.TarInfo("x.json")
        tar.addfile(info, io.BytesIO(b""))


def _truncated(p: Path) -> None:
    seed_cache(p.parent / "src", 2)
    from gdnjit.cache.store import DiskCache
    from gdnjit.config import load_config

    export_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(p.parent / "src")})), p)
    p.write_bytes(p.read_bytes()[:40])


@pytest.mark.parametrize("make, got", [
    (_not_gzip, "got one that cannot be read (not a gzip file)"),
    (_plain_tar, "got one that cannot be read (not a gzip file)"),
    (_truncated, "got one that cannot be read ("),
    (None, "got no such file"),
    (Path.mkdir, "got a directory"),
], ids=["text", "plain-tar", "truncated", "missing", "directory"])
def test_cache_import_not_an_archive(cache_dir, tmp_path, make, got):
    seed_cache(cache_dir, 1)
    archive = tmp_path / "in.tar.gz"
    if make is not None:
        make(archive)
    line = bad_input(["cache", "import", str(archive)], cache_dir, got)
    assert line.startswith(f"gdnjit cache: archive '{archive}': expected a .tar.gz file made by "
                           f"`gdnjit cache export`, got ")


@pytest.mark.parametrize("where, got", [
    ("nodir/x.tar.gz", "got '{tmp}/nodir', which is missing"),
    ("afile/x.tar.gz", "got '{tmp}/afile', which is not a directory"),
    ("adir", "expected a new file (or, with --force, a regular file to replace), got a directory; nothing written"),
])
def test_cache_export_into_missing_dir(cache_dir, tmp_path, where, got):
    seed_cache(cache_dir, 1)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    out = tmp_path / where
    others = tree(tmp_path / "adir"), tree(tmp_path / "afile")
    line = bad_input(["cache", "export", str(out)], cache_dir, got.format(tmp=tmp_path))
    assert line.startswith(f"gdnjit cache: archive '{out}': expected a ")
    assert (tree(tmp_path / "adir"), tree(tmp_path / "afile")) == others
    assert not (tmp_path / "nodir").exists()


def test_export_writes_nothing_when_it_fails(cache_dir, tmp_path, monkeypatch):
    """A failure while the archive is written (here: a cubin that cannot be read) leaves no file."""
    seed_cache(cache_dir, 2)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(tarfile.TarFile, "add", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    from gdnjit.cache.archive import ArchiveError
    from gdnjit.cache.store import DiskCache
    from gdnjit.config import load_config

    with pytest.raises(ArchiveError, match=r"x\.tar\.gz': cannot be written \(I/O\)"):
        export_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(cache_dir)})), out / "x.tar.gz")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("verbose", [False, True], ids=["dry-run-mid-output", "verbose-at-flush"])
def test_closed_stdout_ends_quietly(warm_copy, verbose):
    """``gdnjit warm ... | head``: the reader goes away; no traceback, the shell's status for SIGPIPE.
    A dry run fills the pipe (the error comes mid-print); the -v table of a cached warm fits in the
    buffer (the error comes at the final flush)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env["GDNJIT_CACHE_DIR"] = str(warm_copy)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [*WARM, "-v"] if verbose else [*WARM, "--dry-run"]
    proc = subprocess.Popen([sys.executable, "-m", "gdnjit.cli", *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child has written a byte (it is still importing)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    if not verbose:
        assert err == ""


def test_supported_archs_come_from_the_sm_table():
    from gdnjit.warm import KNOWN_SM_COUNTS, SUPPORTED_ARCHS

    assert {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"} <= set(SUPPORTED_ARCHS)
    assert {int(a[3:].rstrip("af")) for a in SUPPORTED_ARCHS} == set(KNOWN_SM_COUNTS)
    assert not {"sm_42", "sm_70", "sm_80", "sm_90f"} & set(SUPPORTED_ARCHS)


@pytest.mark.parametrize("argv, arch", [
    (["warm", "--shapes", "qwen35.yaml", "--arch", "sm_42", "--num-sms", "132"], "sm_42"),
    (["warm", "--shapes", "qwen35.yaml", "--arch", "sm_70", "--num-sms", "132", "-j", "1"], "sm_70"),
    (["warm", "--shapes", "qwen35.yaml", "--arch", "sm_90", "--arch", "sm_80"], "sm_80"),
    (["render", "gdn", "--arch", "sm_70"], "sm_70"),
    (["spec", "show", "gdn", "--B", "1", "--arch", "sm_42"], "sm_42"),
], ids=["warm-sm_42", "warm-sm_70", "warm-second", "render", "spec-show"])
def test_unsupported_arch(cache_dir, argv, arch):
    from gdnjit.warm import SUPPORTED_ARCHS

    line = bad_input(argv, cache_dir)
    assert line == (f"gdnjit {argv[0]}: argument --arch: expected one of {', '.join(SUPPORTED_ARCHS)}, "
                    f"got '{arch}' (see gdnjit {argv[0]} --help)")


def test_unsupported_local_arch(cache_dir, monkeypatch):
    """Without --arch, warm uses the local GPU's arch, and tune always does: checked the same way."""
    from gdnjit import runner
    from gdnjit.warm import SUPPORTED_ARCHS

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cli, "_local_arch", lambda: "sm_80")
    line = bad_input(["warm", "--shapes", "qwen35.yaml"], cache_dir)
    assert line == ("gdnjit warm: the local GPU's arch (pass --arch to warm for another): expected one of "
                    f"{', '.join(SUPPORTED_ARCHS)}, got 'sm_80'")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(runner, "device_info", lambda i: runner.DeviceInfo(i, "NVIDIA A100", "sm_80", 108))
    line = bad_input(["tune", "--shapes", "qwen35.yaml"], cache_dir)
    assert line == f"gdnjit tune: the local GPU's arch: expected one of {', '.join(SUPPORTED_ARCHS)}, got 'sm_80'"


@pytest.mark.parametrize("argv, option, value, expected", [
    ([*WARM, "--num-sms", "-5"], "--num-sms", "-5", "a positive integer"),
    ([*WARM, "--num-sms", "0"], "--num-sms", "0", "a positive integer"),
    ([*WARM, "-j", "-3"], "-j/--jobs", "-3", "a positive integer"),
    ([*WARM, "-j", "0"], "-j/--jobs", "0", "a positive integer"),
    (["render", "gdn", "--B", "-4"], "--B", "-4", "a positive integer"),
    (["render", "gdn", "--H", "0"], "--H", "0", "a positive integer"),
    (["render", "gdn", "--HV", "-32"], "--HV", "-32", "a positive integer"),
    (["render", "gdn", "--num-sms", "many"], "--num-sms", "many", "a positive integer"),
    (["spec", "show", "gdn", "--B", "-4"], "--B", "-4", "a positive integer"),
    (["tune", "--shapes", "qwen35.yaml", "--b", "1", "-2"], "--b", "-2", "a positive integer"),
    (["tune", "--shapes", "qwen35.yaml", "--b", "0"], "--b", "0", "a positive integer"),
    (["tune", "--shapes", "qwen35.yaml", "--max-problems", "-1"], "--max-problems", "-1", "an integer >= 0"),
])
def test_counts_must_be_positive(cache_dir, argv, option, value, expected):
    line = bad_input(argv, cache_dir)
    assert line == (f"gdnjit {argv[0]}: argument {option}: expected {expected}, got '{value}' "
                    f"(see gdnjit {argv[0]} --help)")


def _archive(path: Path, members: dict[str, bytes], dot: bool = False) -> None:
    with tarfile.open(path, "w:gz") as tar:
        if dot:  # what `tar -C dir -czf x.tar.gz .` writes first
            info = tarfile.TarInfo(".")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(f"./{name}" if dot else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# ---- the cache commands never destroy files --------------------------------------------------------


def _export_target(kind: str, out: Path) -> None:
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "symlink":
        (out.parent / "target").write_bytes(b"keep me")
        out.symlink_to(out.parent / "target")
    elif kind == "file":
        out.write_bytes(b"keep me")
    else:
        out.mkdir()


@pytest.mark.parametrize("kind, got", [
    ("fifo", "got a FIFO"), ("symlink", "got a symbolic link"), ("dir", "got a directory"),
    ("file", "got an existing file (pass --force to replace it)"),
])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_cache_export_refuses_to_replace(cache_dir, tmp_path, kind, got, force):
    """One line, exit 2, the target and everything beside it unchanged; --force replaces a regular file only."""
    seed_cache(cache_dir, 2)
    out = tmp_path / "out" / "x.tar.gz"
    out.parent.mkdir()
    _export_target(kind, out)
    argv = ["cache", "export", str(out), *(["--force"] if force else [])]
    if force and kind == "file":
        rc, stdout, err = run_cli_exit(argv)
        assert rc == 0 and err == "" and stdout.strip() == f"exported 2 entries from {cache_dir / ENTRY_DIR} to {out}"
        assert tarfile.is_tarfile(out)
        return
    before = tree(out.parent)
    line = bad_input(argv, cache_dir)
    assert line.startswith(f"gdnjit cache: archive '{out}': expected a new file") and got in line
    assert line.endswith("nothing written")
    assert tree(out.parent) == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_cache_export_to_a_device_changes_nothing(cache_dir, force):
    """Run as root, an export to /dev/full replaced the device node with a regular file."""
    seed_cache(cache_dir, 1)
    before = os.lstat("/dev/full")
    line = bad_input(["cache", "export", "/dev/full", *(["--force"] if force else [])], cache_dir)
    assert line == ("gdnjit cache: archive '/dev/full': expected a new file (or, with --force, a regular file to "
                    "replace), got a character device; nothing written")
    after = os.lstat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


@pytest.mark.parametrize("argv, line", [
    (["cache", "clear", "ANYTHING"], "clear: unexpected argument 'ANYTHING' (only export and import take a FILE)"),
    (["cache", "verify", "FILE"], "verify: unexpected argument 'FILE' (only export and import take a FILE)"),
    (["cache", "ls", "x"], "ls: unexpected argument 'x' (only export and import take a FILE)"),
    (["cache", "evict", "x", "--max-bytes", "1"], "evict: unexpected argument 'x' (only export and import take a FILE)"),
    (["cache", "ls", "--repair"], "ls: unexpected option --repair (only verify take --repair)"),
    (["cache", "clear", "--max-bytes", "1"], "clear: unexpected option --max-bytes (only evict take --max-bytes)"),
    (["cache", "import", "a.tar.gz", "--force"], "import: unexpected option --force (only export take --force)"),
    (["cache", "export", "a.tar.gz", "--replace"], "export: unexpected option --replace (only import take --replace)"),
    (["cache", "clear", "-v"], "clear: unexpected option -v (only ls take -v)"),
    (["cache", "export"], "export: expected FILE, the .tar.gz archive, got none"),
    (["cache", "import"], "import: expected FILE, the .tar.gz archive, got none"),
])
def test_cache_unexpected_arguments_are_errors(cache_dir, tmp_path, monkeypatch, argv, line):
    """``cache clear ANYTHING`` deleted the whole cache; now nothing happens but one line and exit 2."""
    monkeypatch.chdir(tmp_path)
    seed_cache(cache_dir, 2)
    assert bad_input(argv, cache_dir) == f"gdnjit cache: {line}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def _entries_archive(tmp_path: Path, n: int = 2) -> Path:
    seed_cache(tmp_path / "src", n)
    archive = tmp_path / "in.tar.gz"
    export_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "src")})), archive)
    return archive


@pytest.mark.parametrize("member, why", [
    ("../evil.json", "'../evil.json' points outside the archive"),
    ("/tmp/evil.json", "'/tmp/evil.json' points outside the archive"),
    ("entries/e.cubin", "'entries/e.cubin' has a directory part"),
    ("LINK", "'link.cubin' is a symbolic link"),
])
def test_cache_import_refuses_unsafe_members(cache_dir, tmp_path, member, why):
    seed_cache(cache_dir, 1)
    archive = _entries_archive(tmp_path)
    with tarfile.open(archive, "r:gz") as tar:
        old = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(archive, "w:gz") as tar:
        for m, data in old:
            tar.addfile(m, io.BytesIO(data))
        info = tarfile.TarInfo("link.cubin" if member == "LINK" else member)
        if member == "LINK":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    line = bad_input(["cache", "import", str(archive)], cache_dir)
    assert line == (f"gdnjit cache: archive '{archive}': expected flat regular entry files, got 1 unsafe member(s) "
                    f"({why}); nothing imported")
    assert not (tmp_path / "evil.json").exists()


def test_cache_import_refuses_an_oversized_member_before_reading_it(cache_dir, tmp_path):
    """A 1 MB archive holding one member that claims 1 GiB: refused from its header, in well under a second."""
    from gdnjit.cache.archive import MAX_MEMBER_BYTES

    seed_cache(cache_dir, 1)
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("e0-" + "0" * 32 + ".cubin")
        info.size = 1 << 30
        tar.addfile(info)  # the header alone: reading the member would fail on the missing data
    t0 = time.perf_counter()
    line = bad_input(["cache", "import", str(archive)], cache_dir)
    assert time.perf_counter() - t0 < 5
    assert line == (f"gdnjit cache: archive '{archive}': expected members of at most {MAX_MEMBER_BYTES} bytes, got "
                    f"'{info.name}' of {1 << 30} bytes; nothing imported")


def test_cache_import_keeps_a_differing_local_entry_unless_replace(cache_dir, tmp_path):
    archive = _entries_archive(tmp_path)
    names = seed_cache(cache_dir, 1)  # e0: the same name and key as the archive's e0 ...
    local = cache_dir / ENTRY_DIR / f"{names[0]}.cubin"
    from gdnjit.cache.store import read_entry

    meta = json.loads((cache_dir / ENTRY_DIR / f"{names[0]}.json").read_text())
    cubin = b"local build" * 8  # ... and another valid cubin
    meta.update(cubin_size=len(cubin), cubin_sha256=hashlib.sha256(cubin).hexdigest())
    local.write_bytes(cubin)
    (cache_dir / ENTRY_DIR / f"{names[0]}.json").write_text(json.dumps(meta))
    assert read_entry(cache_dir / ENTRY_DIR, names[0], meta["key"])[0] is not None
    rc, out, err = run_cli_exit(["cache", "import", str(archive)])
    assert rc == 1
    assert out.strip() == (f"imported 1 entries into {cache_dir / ENTRY_DIR} (1 new, 0 replaced, 0 already present, "
                           f"1 kept, 0 invalid skipped, 0 other files skipped)")
    assert err == (f"gdnjit cache import: kept the local entry {names[0]}: its cubin differs from the archive's "
                   f"(pass --replace to take the archive's)\n")
    assert local.read_bytes() == cubin
    rc, out, err = run_cli_exit(["cache", "import", str(archive), "--replace"])
    assert rc == 0 and err == ""
    assert out.strip() == (f"imported 1 entries into {cache_dir / ENTRY_DIR} (0 new, 1 replaced, 1 already present, "
                           f"0 kept, 0 invalid skipped, 0 other files skipped)")
    assert local.read_bytes() == (tmp_path / "src" / ENTRY_DIR / f"{names[0]}.cubin").read_bytes()
    assert run_cli_exit(["cache", "verify"])[0] == 0


def test_cache_import_names_skipped_files(cache_dir, tmp_path):
    archive = _entries_archive(tmp_path)
    with tarfile.open(archive, "r:gz") as tar:
        old = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    _archive(archive, {**{m.name: data for m, data in old}, "NOTES.txt": b"hi", "bad-00.json": b"{}"})
    rc, out, err = run_cli_exit(["cache", "import", str(archive)])
    assert rc == 1 and "Traceback" not in err
    assert out.strip().endswith("(2 new, 0 replaced, 0 already present, 0 kept, 1 invalid skipped, "
                                "1 other files skipped)")
    assert err.splitlines() == [
        "gdnjit cache import: skipped invalid entry bad-00 (incomplete, or its cubin does not match its sidecar or name)",
        "gdnjit cache import: skipped 'NOTES.txt': not a cache entry file"]


def test_cache_ls_of_a_cache_not_created_yet(cache_dir):
    rc, out, err = run_cli_exit(["cache", "ls"])
    assert rc == 0 and out == ""
    assert err == f"rw total: 0 entries, 0 bytes (0 B) in {cache_dir / ENTRY_DIR} (not created yet)\n"
    assert not cache_dir.exists()


def _no_half_entries(d: Path) -> None:
    names = {p.name for p in d.iterdir()} if d.is_dir() else set()
    stems = {n.rsplit(".", 1)[0] for n in names}
    assert names == {f"{s}{x}" for s in stems for x in (".cubin", ".json")}, names


def test_warm_onto_a_full_disk_injected(cache_dir, monkeypatch):
    """The fifth entry's sidecar hits ENOSPC: one line naming the dir and the reason, exit 2, no half entry."""
    from gdnjit.cache import store

    real, writes = store.write_atomic, []

    def write(path, data):
        writes.append(path)
        if len(writes) == 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(store, "write_atomic", write)
    rc, out, err = run_cli_exit([*WARM, "-j", "1"])
    assert rc == 2 and "Traceback" not in err, err
    *progress, line = err.splitlines()  # stderr is no tty here: a line per compiled variant, then the error
    assert [p.split()[1] for p in progress] == ["compiled"] * 4
    assert line.startswith("gdnjit warm: GDNJIT_CACHE_DIR: cannot write entry ")
    assert line.endswith(f" in '{cache_dir / ENTRY_DIR}': no space left on device")
    _no_half_entries(cache_dir / ENTRY_DIR)
    assert len(list((cache_dir / ENTRY_DIR).glob("*.cubin"))) == 4
    assert not (cache_dir / "plans").exists()  # a failed warm records no plan


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_warm_onto_a_full_tmpfs(tmp_path, monkeypatch):
    """A real full file system (a 192 KiB tmpfs), two worker processes: one line, exit 2, no half entry, and the
    warm stops instead of failing every remaining variant."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        d = mnt / "cache"
        _clean_env(monkeypatch, d)
        t0 = time.perf_counter()
        rc, out, err = run_cli_exit([*WARM, "-j", "2"])
        assert rc == 2 and "Traceback" not in err, err
        *progress, line = err.splitlines()
        assert all(p.split()[1] == "compiled" for p in progress), err
        assert line.startswith("gdnjit warm: GDNJIT_CACHE_DIR: cannot write entry ")
        assert line.endswith(f" in '{d / ENTRY_DIR}': no space left on device"), err
        assert time.perf_counter() - t0 < 60
        _no_half_entries(d / ENTRY_DIR)
        assert [p for p in (d / ENTRY_DIR).iterdir() if p.name.startswith(".")] == []  # no temp file either
    finally:
        set_config(None)
        subprocess.run(["umount", str(mnt)], check=True)


def test_cache_import_dot_slash_members(cache_dir, tmp_path):
    """An archive made with ``tar -C entries -czf x.tar.gz .`` (members ``./<name>.cubin``) imports."""
    names = seed_cache(tmp_path / "src", 2)
    src = tmp_path / "src" / ENTRY_DIR
    archive = tmp_path / "dot.tar.gz"
    _archive(archive, {p.name: p.read_bytes() for p in sorted(src.iterdir())}, dot=True)
    rc, out, err = run_cli_exit(["cache", "import", str(archive)])
    assert rc == 0, err
    assert out.strip() == (f"imported 2 entries into {cache_dir / ENTRY_DIR} (2 new, 0 replaced, 0 already present, "
                           f"0 kept, 0 invalid skipped, 0 other files skipped)")
    assert {p.name for p in (cache_dir / ENTRY_DIR).iterdir()} == {p.name for p in src.iterdir()}
    rc, out, _ = run_cli_exit(["cache", "verify"])
    assert rc == 0 and out.strip() == f"{len(names)} entries checked in {cache_dir / ENTRY_DIR}, 0 bad"


@pytest.mark.parametrize("content", ["no-entries", "only-invalid", "empty-export"])
def test_cache_import_without_entries_is_an_error(cache_dir, tmp_path, content):
    archive = tmp_path / "x.tar.gz"
    other = 0
    if content == "no-entries":
        _archive(archive, {"README": b"hello", ".e-0.json": b"{}"}, dot=True)
        invalid, other = 0, 2
    elif content == "only-invalid":
        name = seed_cache(tmp_path / "src", 1)[0]
        cubin = (tmp_path / "src" / ENTRY_DIR / f"{name}.cubin").read_bytes()
        _archive(archive, {f"{name}.cubin": cubin[:-1], f"{name}.json":
                           (tmp_path / "src" / ENTRY_DIR / f"{name}.json").read_bytes()})
        invalid = 1
    else:
        from gdnjit.cache.store import DiskCache
        from gdnjit.config import load_config

        assert export_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "empty")})), archive) == 0
        invalid = 0
    line = bad_input(["cache", "import", str(archive)], cache_dir)
    assert line == (f"gdnjit cache: archive '{archive}': expected cache entries (<name>.cubin + <name>.json "
                    f"pairs, as `gdnjit cache export` writes them), got none that is valid ({invalid} invalid, "
                    f"{other} other files); nothing imported")


@pytest.mark.parametrize("target, message", [
    ("nofile.yaml", "spec file 'nofile.yaml': no such file"),
    ("nofile.yml", "spec file 'nofile.yml': no such file"),
    ("specs/gdn", "spec file 'specs/gdn': no such file"),
    ("adir", "spec file 'adir': expected a YAML file, got a directory"),
    ("nospec", "'nospec': expected a spec file or a shipped spec name (causal_conv1d_update, gdn, gdn_lazy, nvfp4_quantize), got neither "
               "(no such file, no such spec)"),
])
def test_spec_validate_missing_target(cache_dir, tmp_path, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    line = bad_input(["spec", "validate", target], cache_dir)
    assert line == f"gdnjit spec: {message}"


@pytest.mark.parametrize("name, value, message", [
    ("GDNJIT_PDL", "sometimes", "expected one of 1/0/true/false, got 'sometimes'"),
    ("GDNJIT_DISABLE_JIT", "maybe", "expected one of 1/0/true/false, got 'maybe'"),
    ("GDNJIT_LOCK_TIMEOUT", "soon", "expected seconds (a finite number >= 0), got 'soon'"),
    ("GDNJIT_LOCK_TIMEOUT", "-1", "expected seconds (a finite number >= 0), got '-1'"),
    ("GDNJIT_LOCK_TIMEOUT", "nan", "expected seconds (a finite number >= 0), got 'nan'"),
    ("GDNJIT_LOCK_TIMEOUT", "inf", "expected seconds (a finite number >= 0), got 'inf'"),
    ("GDNJIT_LOCK_TIMEOUT", "1e400", "expected seconds (a finite number >= 0), got '1e400'"),
    ("GDNJIT_LOG_LEVEL", "loud", "expected a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL), "
                                 "got 'loud'"),
    ("GDNJIT_CACHE_MAX_BYTES", "lots", "expected a size in bytes"),
])
@pytest.mark.parametrize("argv", [["list"], ["render", "gdn"], [*WARM, "--dry-run"], ["cache", "ls"]],
                         ids=["list", "render", "warm", "cache-ls"])
def test_bad_environment_variable(cache_dir, monkeypatch, name, value, message, argv):
    """Checked before any output, whatever the command (``list`` used to print the specs first)."""
    monkeypatch.setenv(name, value)
    line = bad_input(argv, cache_dir)
    assert line.startswith(f"gdnjit {argv[0]}: environment variable {name}: {message}")


def test_bad_environment_variable_subprocess(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env.update(GDNJIT_CACHE_DIR=str(tmp_path / "cache"), GDNJIT_PDL="sometimes")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "gdnjit.cli", "list"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("gdnjit list: environment variable GDNJIT_PDL: expected one of 1/0/true/false, "
                           "got 'sometimes'\n")
    assert not (tmp_path / "cache").exists()


# ---- warm: spills are reported; --strict ------------------------------------------------------------


def _fake_warm(spill_index: int | None, fail_index: int | None = None):
    from gdnjit.warm import WarmResult

    def fake(variants, config, jobs=None, on_done=None):
        out = []
        for i, v in enumerate(variants):
            meta = {"registers": 255 if i == spill_index else 64, "spill_bytes": 24 if i == spill_index else 0}
            if i == fail_index:
                out.append(WarmResult(v.name, v.describe(), "failed", 0.0, {}, "// source and log"))
            else:
                out.append(WarmResult(v.name, v.describe(), "cached", 0.0, meta))
        return out

    return fake


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_warm_reports_each_spilling_variant(cache_dir, planned, monkeypatch, strict):
    import gdnjit.warm

    monkeypatch.setattr(gdnjit.warm, "warm", _fake_warm(spill_index=2))
    rc, out, err = run_cli_exit([*WARM, *(["--strict"] if strict else [])])
    v = planned[2]
    warning = f"gdnjit warm: warning: variant {v.name} spills 24 bytes (255 registers): {v.describe()}"
    assert warning in err.splitlines()
    assert "1 with spills" in out and "Traceback" not in err
    if strict:
        assert rc == 1
        assert err.splitlines()[-1] == "gdnjit warm: --strict: 1 variant(s) spill registers (listed above)"
    else:
        assert rc == 0 and err.splitlines() == [warning]


def test_warm_strict_without_spills_passes_and_failures_fail(cache_dir, monkeypatch):
    import gdnjit.warm

    monkeypatch.setattr(gdnjit.warm, "warm", _fake_warm(spill_index=None))
    rc, out, err = run_cli_exit([*WARM, "--strict"])
    assert rc == 0 and err == "" and "0 with spills" in out
    monkeypatch.setattr(gdnjit.warm, "warm", _fake_warm(spill_index=None, fail_index=0))
    rc, out, err = run_cli_exit([*WARM, "--strict"])
    assert rc == 1 and "1 failed" in out and err.startswith("FAILED ")


def test_warm_help_documents_strict(capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(["warm", "--help"])
    assert ei.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--strict exit with status 1 if any variant spills registers" in text
    assert "records its plan in <cache dir>/plans/" in text


@pytest.mark.parametrize("argv, needles", [
    (["render", "causal_conv1d_update"], ("--fact: spec causal_conv1d_update needs the facts ['D']", "-f D=VALUE")),
    (["render", "gdn", "-f", "M=3"], ("--fact: expected facts of spec gdn", "unknown ['M']")),
    (["render", "nvfp4_quantize", "-f", "M=0"], ("--fact: expected positive integers", "'M': 0")),
    (["spec", "show", "causal_conv1d_update", "-f", "B=4"], ("needs the facts ['D']",)),
    (["render", "gdn", "-f", "B"], ("--fact: expected NAME=VALUE",)),
])
def test_bad_facts(cache_dir, argv, needles):
    bad_input(argv, cache_dir, *needles)


def test_facts_of_any_spec():
    """-f gives the facts of every spec (conv: D; nvfp4: M), and what the rules see changes with them."""
    rc, out, _ = run_cli(["spec", "show", "causal_conv1d_update", "-p", "contig=true", "-f", "D=12288", "--B", "64"])
    assert rc == 0 and "'D': 12288" in out and "CHOSEN {'vec': 2, 'threads': 128}" in out
    rc, out, _ = run_cli(["render", "nvfp4_quantize", "-p", "K=7680", "-f", "M=8192"])
    assert rc == 0 and "constexpr int K = 7680;" in out and "blocks_per_thread=2" in out


# ---- issue 54: README's command lines run; spec show FILE; --help; -p defaults; list's summary --------------


def _readme_command_lines() -> list[str]:
    """The ``gdnjit ...`` lines of README.md's "Command line" block, each without its trailing comment."""
    block = (REPO / "README.md").read_text().split("## Command line", 1)[1].split("```", 2)[1]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("gdnjit ")]


def _argvs(line: str) -> list[list[str]]:
    """The argv (after ``gdnjit``) of a README command line without its ``[optional]`` parts, and with all of them."""
    bare, full = re.sub(r"\s*\[[^]]*\]", "", line), re.sub(r"\[([^]]*)\]", r"\1", line)
    return [shlex.split(text)[1:] for text in dict.fromkeys([bare, full])]


def test_readme_command_lines_run(cache_dir, monkeypatch):
    """Every render / list / spec show line of README's "Command line" block runs as shown (with and without its
    [optional] parts) without a GPU: status 0, output, nothing on stderr. The spec show examples (a gdn call, an
    NVFP4 call, a spec file) each explain the rules and choose one; a render prints CUDA source."""
    monkeypatch.chdir(REPO)  # the spec file example's path is relative to the repository
    lines = [line for line in _readme_command_lines()
             if line.split()[1] in ("render", "list") or line.startswith("gdnjit spec show ")]
    shows = [line for line in lines if line.startswith("gdnjit spec show ")]
    assert [s.split()[3] for s in shows] == ["gdn", "nvfp4_quantize", "gdnjit/specs/gdn.yaml"], shows
    assert sum(line.startswith("gdnjit render ") for line in lines) >= 2
    assert sum(line.startswith("gdnjit list") for line in lines) == 1
    for line in lines:
        for argv in _argvs(line):
            rc, out, err = run_cli(argv)
            assert (rc, err) == (0, ""), (argv, err)
            assert out, argv
            if argv[0] == "render":
                assert out.startswith("// gdnjit: ") and 'extern "C"' in out, argv
            if argv[0] == "spec":
                assert sum("CHOSEN" in row for row in out.splitlines()) == 1, argv
    # README's old example named a fact gdn does not have (M): it is refused, as any unknown fact
    bad_input(["spec", "show", "gdn", "--B", "1", "-p", "K=128", "-f", "M=4096"], cache_dir,
              "--fact: expected facts of spec gdn (B, H, HV, num_sms), got unknown ['M']")


def test_spec_show_takes_a_spec_file(cache_dir, tmp_path, monkeypatch):
    """``spec show`` takes what ``spec validate`` takes: a spec file shows the spec it holds (the shipped gdn.yaml:
    what ``spec show gdn`` shows), an edited copy its edits; a bad or missing file is validate's one line; more
    than one target is one line too (the first was shown, the others ignored)."""
    monkeypatch.chdir(REPO)
    rc, by_name, err = run_cli(["spec", "show", "gdn", "--B", "1"])
    assert (rc, err) == (0, "")
    rc, by_file, err = run_cli(["spec", "show", "gdnjit/specs/gdn.yaml", "--B", "1"])
    assert (rc, err) == (0, "")
    assert by_file == by_name.replace("   file: gdn.yaml\n", "   file: gdnjit/specs/gdn.yaml\n", 1) != by_name
    # an edited copy under another name: shown as it is; qwen35.yaml does not call it, so the params -p leaves out
    # take their first allowed value (W = 2, where the shipped spec's Qwen3.5 call has W = 4)
    text = (REPO / "gdnjit/specs/causal_conv1d_update.yaml").read_text()
    assert text.startswith("name: causal_conv1d_update\n")
    mine = tmp_path / "my_conv.yaml"
    mine.write_text(text.replace("name: causal_conv1d_update\n", "name: my_conv\n", 1))
    rc, out, err = run_cli(["spec", "show", str(mine), "-f", "D=4096", "--B", "8"])
    assert (rc, err) == (0, "") and out.startswith("spec my_conv: ")
    assert "'W': 2" in out and "'contig': False" in out and "CHOSEN" in out
    rc, out, err = run_cli(["spec", "show", "causal_conv1d_update", "-f", "D=4096", "--B", "8"])
    assert (rc, err) == (0, "") and "'W': 4" in out and "'contig': True" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("template: causal_conv1d_update.cu.j2", "template: x.j2"))
    bad_input(["spec", "show", str(bad)], cache_dir, f"gdnjit spec: {bad}:", "template")
    line = bad_input(["spec", "show", "nofile.yaml"], cache_dir)
    assert line == "gdnjit spec: spec file 'nofile.yaml': no such file"
    line = bad_input(["spec", "show", "nospec"], cache_dir)
    assert line.startswith("gdnjit spec: 'nospec': expected a spec file or a shipped spec name (")
    line = bad_input(["spec", "show", "gdn", "nvfp4_quantize"], cache_dir)
    assert line == ("gdnjit spec: show: expected one target (a spec file or a shipped spec name), got 2: "
                    "['gdn', 'nvfp4_quantize']")
    line = bad_input(["spec", "show", "gdnjit/specs/gdn.yaml", "gdn", "--B", "1"], cache_dir)
    assert line.endswith("got 2: ['gdnjit/specs/gdn.yaml', 'gdn']")


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as ei:
        cli.main([*argv, "--help"])
    assert ei.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_every_command(capsys):
    """``gdnjit --help`` names every command: its list is the parser's own (``tune`` was once left out)."""
    text = _help([], capsys)
    commands = re.search(r"usage: gdnjit \[-h\] \{([a-z_,]+)\}", text).group(1).split(",")
    assert {"warm", "tune", "render", "list", "cache", "spec"} <= set(commands)
    assert f"Commands: {', '.join(commands)} (gdnjit COMMAND --help for each)." in text
    for command in commands:
        assert _help([command], capsys).startswith(f"usage: gdnjit {command} ")


@pytest.mark.parametrize("command", [["render", "gdn"], ["spec", "show", "gdn"]], ids=["render", "spec"])
def test_variant_options_are_documented(capsys, command):
    """--num-sms says what it is; -p says where the params it leaves out come from."""
    text = _help(command, capsys)
    assert "--num-sms NUM_SMS shorthand for -f num_sms=VALUE: the SM count the rules see (default 132" in text
    assert ("-p PARAM, --param PARAM spec param NAME=VALUE (default: the value in the spec's first call of the "
            "shipped Qwen3.5 shapes, qwen35.yaml, e.g. K=128 V=128 for gdn") in text


def test_params_default_to_the_shipped_qwen35_shapes(cache_dir):
    """Params -p leaves out take the spec's first call in qwen35.yaml (gdn: K = V = 128, not the first allowed 64),
    in render and spec show alike; a param the target arch sets follows --arch (nvfp4_quantize's hw_e2m1)."""
    from gdnjit.shapes import params_for

    first = {p.spec: p for p in reversed(load_shapes("qwen35.yaml"))}  # each spec's first problem
    assert (params_for(first["gdn"], "sm_90")["K"], params_for(first["gdn"], "sm_90")["V"]) == (128, 128)
    rc, out, err = run_cli(["render", "gdn"])
    assert (rc, err) == (0, "") and "// gdn_step: layout=klast K=128 V=128 T=1 in=bf16 out=bf16" in out
    given = [arg for n, v in first["gdn"].params for arg in ("-p", f"{n}={v}")]
    assert run_cli(["render", "gdn", *given]) == (0, out, "")
    rc, out, err = run_cli(["spec", "show", "gdn", "--B", "1"])
    assert (rc, err) == (0, "") and f"\nfor {params_for(first['gdn'], 'sm_90')} with " in out
    rc, out, err = run_cli(["render", "nvfp4_quantize", "-f", "M=8"])
    assert (rc, err) == (0, "") and "in=bf16 sf_layout=128x4 K=4096 hw_e2m1=False" in out
    rc, out, err = run_cli(["render", "nvfp4_quantize", "-f", "M=8", "--arch", "sm_100a"])
    assert (rc, err) == (0, "") and "in=bf16 sf_layout=128x4 K=4096 hw_e2m1=True" in out
    rc, out, err = run_cli(["spec", "show", "nvfp4_quantize", "-f", "M=8", "--arch", "sm_100a"])
    assert (rc, err) == (0, "") and f"\nfor {params_for(first['nvfp4_quantize'], 'sm_100a')} with " in out
    assert params_for(first["nvfp4_quantize"], "sm_100a")["hw_e2m1"] is True


def test_list_is_a_short_summary(cache_dir):
    """``list``: one line per spec (template; param, tunable and rule counts), a pointer to the detail, the shapes
    files, the cache count; each line under 120 characters. The detail (each spec's description, params, tunables
    and rules: over a hundred lines, some of several hundred characters) is ``list -v``."""
    from gdnjit.spec import get_spec, list_specs

    rc, out, err = run_cli(["list"])
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    specs = [get_spec(name) for name in list_specs()]
    assert len(lines) == len(specs) + 3
    for line, spec in zip(lines, specs):
        assert line.startswith(f"spec {spec.name} ")
        assert line.endswith(f"  template {spec.template}: {len(spec.params)} params, {len(spec.tunables)} "
                             f"tunables, {len(spec.rules)} rules")
    assert lines[-3] == "(each spec's params, tunables and rules: gdnjit list -v, or gdnjit spec show NAME)"
    assert lines[-2].startswith("shapes files: qwen35.yaml, ")
    assert lines[-1] == f"cached variants in {cache_dir / ENTRY_DIR}: 0"
    assert all(len(line) < 120 for line in lines[:-1])  # (the last is as long as the cache dir's path)
    rc, detail, err = run_cli(["list", "--verbose"])
    assert (rc, err) == (0, "") and len(detail.splitlines()) > 3 * len(lines)
    assert detail.splitlines()[-2:] == lines[-2:]
