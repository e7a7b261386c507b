"""The ``gdnjit`` command line, in-process (``gdnjit.cli.main``) with the cache in a temp dir,
plus one fresh-interpreter run to time a fully cached ``warm``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdnjit import cli
from gdnjit.cache.store import ENTRY_DIR
from gdnjit.config import set_config
from gdnjit.shapes import load_shapes
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


def test_second_warm_subprocess_is_fast(warm_copy, planned):
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
    rc, _, err = run_cli(["warm", "--shapes", "qwen35.yaml", "--arch", "sm90"])
    assert rc == 2 and "arch" in err
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
    assert out.strip() == f"removed {2 * n} files from {warm_copy / ENTRY_DIR}"
    assert list((warm_copy / ENTRY_DIR).iterdir()) == []
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
    assert entries(cache_dir, ".cubin") == []  # rendering compiles nothing


def test_render_params_and_tunables(cache_dir):
    rc, out, err = run_cli(["render", "gdn", "-p", "K=64", "-p", "V=64", "-t", "tile_v=16", "--B", "512"])
    assert rc == 0, err
    assert "K=64 V=64" in out and "tile_v=16" in out and "constexpr int TILE_V = 16;" in out


def test_render_bad_input(cache_dir):
    with pytest.raises(SystemExit, match="unknown params"):
        run_cli(["render", "gdn", "-p", "bogus=1"])
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        run_cli(["render", "gdn", "-p", "layout"])
    rc, _, err = run_cli(["render", "gdn", "-p", "K=96"])
    assert rc == 2 and "K" in err and "96" in err
    rc, _, err = run_cli(["render", "nope"])
    assert rc == 2 and "no shipped spec 'nope'" in err


def test_list(cache_dir):
    rc, out, _ = run_cli(["list"])
    assert rc == 0
    assert "spec gdn (template gdn.cu.j2)" in out
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
    bad.write_text((REPO / "gdnjit/specs/gdn.yaml").read_text().replace("template: gdn.cu.j2", "template: x.j2"))
    rc, _, err = run_cli(["spec", "validate", str(bad)])
    assert rc == 2 and f"{bad}:" in err and "template" in err


def test_spec_show(cache_dir):
    rc, out, _ = run_cli(["spec", "show", "gdn", "--B", "1"])
    assert rc == 0
    assert out.startswith("spec gdn: ")
    assert "rule 0 (line " in out
    chosen = [line for line in out.splitlines() if "CHOSEN" in line]
    assert len(chosen) == 1 and chosen[0].startswith("  rule ")
    rc, out, _ = run_cli(["spec", "show", "gdn"])
    assert rc == 0 and "CHOSEN" not in out
    rc, out, _ = run_cli(["spec", "show", "gdn", "-p", "layout=kmajor", "-p", "K=256", "-p", "state_dtype=bf16"])
    assert rc == 0 and "CHOSEN" in out


def test_usage_errors(cache_dir):
    with pytest.raises(SystemExit) as ei:
        run_cli([])
    assert ei.value.code == 2
    with pytest.raises(SystemExit) as ei:
        run_cli(["cache", "frobnicate"])
    assert ei.value.code == 2
