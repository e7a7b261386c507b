"""The examples in examples/ run as scripts and check themselves (GPU: pytest -m gpu tests/ops/test_examples_gpu.py).

Each script compares its results with the torch references and prints OK as its last line. The
``--help`` and CPU (reference backend) runs at the end need no GPU and run in the plain CPU suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def assert_ok(res: subprocess.CompletedProcess) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert res.stdout.strip().splitlines()[-1] == "OK", out


@pytest.mark.gpu
@pytest.mark.parametrize("args", [
    (),
    ("--state-dtype", "bf16", "--requests", "13", "--draft-tokens", "6"),
    ("--no-graph", "--head-dim", "64", "--heads", "4", "--value-heads", "12", "--requests", "1"),
    ("--head-dim", "256", "--value-heads", "16", "--draft-tokens", "16", "--requests", "3"),
], ids=["default", "bf16-state", "eager-small", "k256-t16"])
def test_serving_decode_loop(args):
    assert_ok(run_example("serving_decode_loop.py", *args))


@pytest.mark.gpu
@pytest.mark.parametrize("args", [
    (),
    ("--state-dtype", "bf16", "--requests", "13", "--draft-tokens", "6"),
    ("--head-dim", "64", "--heads", "4", "--value-heads", "12", "--requests", "1", "--draft-tokens", "1"),
    ("--head-dim", "256", "--value-heads", "16", "--draft-tokens", "8", "--requests", "3"),
], ids=["default", "bf16-state", "small-t1", "k256-t8"])
@pytest.mark.parametrize("name", ["speculative_replay_loop.py", "speculative_fused_loop.py"])
def test_speculative_loops(name, args):
    """The two speculative serving loops (FlashInfer's ReplaySSM; gdnjit's fused step), same options."""
    assert_ok(run_example(name, *args))


@pytest.mark.gpu
@pytest.mark.parametrize("args", [(), ("--m", "129", "--k", "7168", "--dtype", "fp16")], ids=["default", "fp16-k7168"])
def test_nvfp4_roundtrip(args):
    assert_ok(run_example("nvfp4_roundtrip.py", *args))


# ---- no GPU needed ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["serving_decode_loop.py", "nvfp4_roundtrip.py", "speculative_replay_loop.py",
                                  "speculative_fused_loop.py"])
def test_help_works_without_a_gpu(name):
    res = run_example(name, "--help", timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("usage:"), res.stderr


def test_nvfp4_roundtrip_on_the_cpu_reference_backend():
    assert_ok(run_example("nvfp4_roundtrip.py", "--device", "cpu", "--m", "40", "--k", "256", timeout=300))
