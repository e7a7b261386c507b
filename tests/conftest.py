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
