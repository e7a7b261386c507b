"""The tools and examples import only names gdnjit has (a renamed or removed helper must not leave a tool
broken until someone runs it on a GPU)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tools").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gdnjit_imports_resolve(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gdnjit":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule, else ImportError


def test_flashinfer_harness_summary_adds_up_files(tmp_path, capsys):
    """run.sh runs each FlashInfer file in its own process (one junit file each); the summary counts them all."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fi_summarize", ROOT / "tools" / "flashinfer_harness" / "summarize.py")
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    a = tmp_path / "a.xml"
    a.write_text('<testsuites><testsuite><testcase classname="tests.gdn.test_x" name="t1"/>'
                 '<testcase classname="tests.gdn.test_x" name="t2"><failure message="E   ValueError: bad 12"/></testcase>'
                 '</testsuite></testsuites>')
    b = tmp_path / "b.xml"
    b.write_text('<testsuites><testsuite><testcase classname="tests.utils.test_y" name="t3"/>'
                 '<testcase classname="tests.utils.test_y" name="t4"><skipped message="no"/></testcase>'
                 '</testsuite></testsuites>')
    assert summarize.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.startswith(("tests/", "total"))}
    assert lines["tests/gdn/test_x.py"] == ["1", "1", "0", "0"]
    assert lines["tests/utils/test_y.py"] == ["1", "0", "0", "1"]
    assert lines["total"] == ["2", "1", "0", "1"]
    assert "ValueError: bad #" not in out and "ValueError: bad 12" in out
    assert summarize.main([str(tmp_path / "missing.xml")]) == 1


def test_bench_spec_floors_split_replayssm(capsys):
    """bench_spec's ReplaySSM verify and commit, timed apart, move exactly the pair's bytes between them (one state
    pass + the tokens' I/O + the cached tokens written; two passes + the accepted ones read back); the dry run builds
    the inputs every mode takes, the commit's caches defined (zeros: it may run without a verify before it)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("bench_spec", ROOT / "tools" / "bench_spec.py")
    bs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bs)
    for B, T, HV, es in ((1, 2, 32, 4), (64, 4, 64, 4), (128, 8, 64, 2)):
        pair = bs.floor_bytes("rs_verify", B, T, HV, es) + bs.floor_bytes("rs_commit", B, T, HV, es)
        assert pair == bs.floor_bytes("replayssm", B, T, HV, es)
        state = B * HV * bs.V * bs.K * es
        assert state < bs.floor_bytes("rs_verify", B, T, HV, es) < 2 * state
        assert 2 * state < bs.floor_bytes("rs_commit", B, T, HV, es) < bs.floor_bytes("fused", B, T, HV, es)
    s = bs.make_set(2, 3, 32, torch.float32, ["rs_commit"], torch.device("cpu"), seed=1)
    assert all(not s[n].any() for n in ("rawk", "rawv", "g_cache", "beta_cache"))


def test_bench_spec_state_copy_moves_the_two_state_passes():
    """bench_spec's `copy` row (the floor's achievable part at a size): its bytes are exactly the fused step's two
    state passes, and its call copies the B requests' states bit for bit, in the state's dtype."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("bench_spec", ROOT / "tools" / "bench_spec.py")
    bs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bs)
    for B, T, HV, es in ((1, 2, 32, 4), (64, 4, 64, 2)):
        assert bs.floor_bytes("copy", B, T, HV, es) == 2 * B * HV * bs.V * bs.K * es
    for sdt in (torch.float32, torch.bfloat16):
        s = bs.make_set(3, 2, 32, sdt, ["copy"], torch.device("cpu"), seed=2)
        assert s["copy_src"].shape == (3, 32, bs.V, bs.K) and s["copy_dst"].dtype == sdt
        bs.copy(s)
        assert torch.equal(s["copy_dst"].view(torch.uint8), s["copy_src"].view(torch.uint8))


def test_bench_compat_force_takes_gdn_tunables_only(capsys, monkeypatch):
    """bench_compat --force: a JSON object of gdn tunables with allowed values (JSON types: 1 is not true), else one
    line naming what was wrong (exit status 2 before any GPU work)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_compat", ROOT / "tools" / "bench_compat.py")
    bcm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bcm)
    ok = '{"lanes_per_row": 8, "ilp": 2, "tile_v": 64, "stage": false, "l2_prefetch": true}'
    assert bcm.bc.parse_force(ok, "gdn") == dict(lanes_per_row=8, ilp=2, tile_v=64, stage=False, l2_prefetch=True)
    for text, said in (("nope", "expected a JSON object of gdn tunables, got 'nope'"),
                       ("{}", "expected a JSON object of gdn tunables"),
                       ('{"lanes": 8}', "'lanes' is not a gdn tunable (expected one of lanes_per_row, ilp"),
                       ('{"ilp": 3}', "ilp: expected one of [1, 2, 4], got 3"),
                       ('{"stage": 1}', "stage: expected one of [false, true], got 1"),
                       ('{"ilp": true}', "ilp: expected one of [1, 2, 4], got true")):
        with pytest.raises(ValueError) as e:
            bcm.bc.parse_force(text, "gdn")
        assert said in str(e.value), e.value
        monkeypatch.setattr(sys, "argv", ["bench_compat.py", "--force", text])
        assert bcm.main() == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bench_compat: --force: ") and said in err, err


def test_bench_lazy_force_and_columns(capsys):
    """bench_lazy --force: gdn_lazy tunables with allowed values, else a usage error naming the tunable; --t with no
    value: only the plain-decoding columns."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_lazy", ROOT / "tools" / "bench_lazy.py")
    blz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blz)
    args = blz.parse_args(["--force", '{"form": "rows", "lanes_per_row": 4, "window": 8}', "--t"])
    assert args.force == dict(form="rows", lanes_per_row=4, window=8) and args.t == []
    assert blz.parse_args([]).force is None and blz.parse_args([]).t == [4, 8]
    for text, said in (('{"form": "tiles"}', 'form: expected one of ["rows", "tile", "eager"], got "tiles"'),
                       ('{"ilp": 2}', "'ilp' is not a gdn_lazy tunable (expected one of form, tile_v")):
        with pytest.raises(SystemExit) as e:
            blz.parse_args(["--force", text])
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_tune_shapes_files_plan_valid_variants():
    """The shapes files `gdnjit tune` is run with (tools/*.yaml) load, and every problem's params have a valid variant
    (a stale param name or value would only fail on the GPU machine, after the first compiles)."""
    from gdnjit import dispatch
    from gdnjit.shapes import iter_facts, load_shapes, params_for
    from gdnjit.spec import get_spec

    files = sorted((ROOT / "tools").glob("*.yaml"))
    assert {f.name for f in files} >= {"bench_shapes.yaml", "tune_multi_token.yaml"}
    for f in files:
        problems = load_shapes(str(f))
        assert problems, f.name
        for prob in problems:
            spec = get_spec(prob.spec)
            params = params_for(prob, "sm_90")
            for facts in iter_facts(prob, 132):
                tunables, _ = dispatch.select(spec, params, facts)
                assert spec.valid(params, tunables), (f.name, prob.call, facts)


def test_ncu_segments_cuts_at_barriers(tmp_path, capsys):
    """tools/ncu_segments.py: per-warp instruction counts between barriers from ncu's source page (the first
    instruction's count is the number of warps), a warp-specialised segment averaged over all warps; bad input is
    one line and exit status 2."""
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("ncu_segments", ROOT / "tools" / "ncu_segments.py")
    seg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seg)
    rows = [("LDC R1, c[0x0][0x28]", 8, 1), ("@!P0 LDS.U16 R2, [R3]", 8, 3), ("BAR.SYNC.DEFER_BLOCKING 0x0", 8, 0),
            ("SHFL.BFLY PT, R4, R5, 0x1, 0x1f", 2, 5), ("FADD R4, R4, R5", 2, 1), ("BAR.SYNC.DEFER_BLOCKING 0x0", 8, 0),
            ("@P0 EXIT", 8, 0)]
    path = tmp_path / "src.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","gdn_step",\n')
        f.write('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n')
        for i, (sass, exe, stall) in enumerate(rows):
            f.write(f'"0x{16 * i:x}","      {sass}","{stall}","{exe}"\n')
    assert seg.opcode("@!P0 LDS.U16 R2, [R3]") == "LDS"
    warps, segs = seg.segments(seg.read_rows(str(path)))
    assert warps == 8
    assert [(s["first"], s["last"]) for s in segs] == [(0, 2), (3, 5), (6, 6)]
    assert [s["per_warp"] for s in segs] == [3.0, 1.5, 1.0]
    assert segs[1]["ops"]["SHFL"] == 0.25 and segs[1]["stall"] == 6
    assert seg.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "7 instructions, 8 warps, 5.5 executed per warp" in out
    assert seg.main([str(path), "--list", "3", "4"]) == 0
    assert "SHFL.BFLY" in capsys.readouterr().out
    assert seg.main([str(path), "--list", "4", "3"]) == 2
    assert "--list: expected 0 <= FIRST <= LAST < 7" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert seg.main([str(bad)]) == 2
    assert "expected ncu's source page as CSV" in capsys.readouterr().err


@pytest.mark.full  # ~13 pytest collections in subprocesses (25 s)
def test_gpu_tests_groups_partition_the_gpu_selection():
    """tools/gpu_tests.sh's groups (run side by side) and its big_memory stage (alone after them) select every test
    `pytest -m gpu` selects, each once: a group edit that drops or doubles tests shows here, not on the device."""
    import shlex
    import subprocess

    script = ROOT / "tools" / "gpu_tests.sh"
    groups = subprocess.run(
        ["bash", "-c", f'source <(sed -n "/^gdn=/,/^)/p" {shlex.quote(str(script))}); printf "%s\\n" "${{args[@]}}"'],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()
    assert len(groups) >= 10, groups

    def collect(marker: str, args: list[str]) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "--co", "-q", "-p", "no:cacheprovider", *args],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode in (0, 5), out.stdout[-2000:] + out.stderr[-2000:]  # 5: nothing collected
        return [line for line in out.stdout.splitlines() if "::" in line]

    selected = [collect("gpu and not big_memory", shlex.split(g)) for g in groups]
    selected.append(collect("gpu and big_memory", ["tests"]))
    every = [n for ids in selected for n in ids]
    assert len(every) == len(set(every)), "a test in two groups"
    assert set(every) == set(collect("gpu", ["tests"]))
