"""Shared fixtures: an isolated cache per test, and the GPU marker's clean skip."""

from __future__ import annotations

import pytest

from gdnjit import config as _config


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_config(tmp_path):
    """A Config whose cache (and locks) live in a fresh temp dir, installed process-wide for the test."""
    cfg = _config.load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "cache")})
    _config.set_config(cfg)
    yield cfg
    _config.set_config(None)


def pytest_sessionfinish(session, exitstatus):
    """Print (and with GDNJIT_TEST_REPORT=path, write) the worst GDN errors per quantity and dtype."""
    import json
    import os
    import sys

    mod = sys.modules.get("gdn_cases")
    if mod is None or not mod.WORST:
        return
    lines = [f"  {k}: {v:.3g}" for k, v in sorted(mod.WORST.items())]
    print("\nworst GDN errors (out/fp32 state: relative in norm; bf16 state: in bf16 ulps):\n" + "\n".join(lines))
    path = os.environ.get("GDNJIT_TEST_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(mod.WORST, f, indent=1, sort_keys=True)
