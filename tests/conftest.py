"""Shared fixtures: an isolated cache per test, the GPU marker's clean skip, and the two test tiers.

Test tiers (one switch, the environment variable ``GDNJIT_TEST_FULL``):

* default (``python -m pytest -q``): every test module and error path, a sample of each large
  parametrization (``@pytest.mark.sample``) and each fuzz test at a smaller depth; a few minutes on 2 cores.
* full (``GDNJIT_TEST_FULL=1 python -m pytest -q``): everything: also the tests marked ``full`` (the
  whole compile matrix, slow CLI fixtures, ...), every case of the sampled parametrizations, and the fuzz
  tests at depth (test modules read the same variable for their hypothesis ``max_examples``).

``GDNJIT_TEST_FULL=1 python -m pytest -q -m "full or deep"`` runs only what the default tier left out or ran
shallow: the ``full`` tests (a sampled parametrization's other cases get the marker here) and the ``deep``
ones (every hypothesis test gets that marker here), so the default run plus this one is the full tier (.ci/run).

GPU tests (marked ``gpu``) are not tiered: ``python -m pytest -m gpu`` runs all of them on a GPU machine.
"""

from __future__ import annotations

import gc
import os

import pytest

from gdnjit import config as _config

# Collection builds ~5,000 items on top of torch's ~180k objects: every automatic full collection walks them
# all (1-2 s of a 4-5 s collection). Collection runs without the automatic collector; afterwards what it built
# is frozen (gc.freeze: never walked again, it lives until the session ends anyway) and the collector is back
# on for the tests (pytest_collection below).
gc.disable()

FULL = os.environ.get("GDNJIT_TEST_FULL", "").strip() not in ("", "0")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


HAS_GPU = _has_gpu()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def pytest_unconfigure(config):
    gc.enable()  # a run that stopped before collection (--help, a usage error)


def _hashable(value):
    try:
        hash(value)
        return type(value).__name__, value
    except TypeError:
        return type(value).__name__, repr(value)


def _sample(items: list, n: int, cover: tuple[str, ...]) -> set[int]:
    """Indices (into items, one test function's cases in collection order) of the default tier's sample:
    n cases spread evenly, plus the fewest more (greedy) so that every value of each parameter named in
    ``cover`` occurs."""
    keep = {round(i * (len(items) - 1) / max(n - 1, 1)) for i in range(min(n, len(items)))} if n else set()

    def pairs(i):
        params = items[i].callspec.params
        return {(a, _hashable(params[a])) for a in cover}

    missing = set().union(*(pairs(i) for i in range(len(items)))) - set().union(*(pairs(i) for i in keep), set())
    while missing:
        best = max(range(len(items)), key=lambda i: (len(pairs(i) & missing), -i))
        keep.add(best)
        missing -= pairs(best)
    return keep


def _check_sample_marker(item, mark) -> tuple[int, tuple[str, ...]]:
    n = mark.kwargs.get("n", mark.args[0] if mark.args else 1)
    cover = tuple(mark.kwargs.get("cover", ()))
    unknown = set(mark.kwargs) - {"n", "cover"}
    if unknown or not isinstance(n, int) or n < 0 or not hasattr(item, "callspec"):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.sample(n=INT, cover=(ARGNAME, ...)) goes on a "
                                f"parametrized test (got args={mark.args}, kwargs={mark.kwargs})")
    bad = [a for a in cover if a not in item.callspec.params]
    if bad:
        raise pytest.UsageError(f"{item.nodeid}: sample(cover=...) names {bad}, not parameters of the test")
    return n, cover


def _named(config) -> list[str]:
    """The node ids the command line names (``FILE::TEST`` or ``FILE::TEST[ID]``), relative to the rootdir."""
    out = []
    for arg in config.args:
        if "::" not in arg:
            continue
        path, rest = arg.split("::", 1)
        try:
            rel = (config.invocation_params.dir / path).resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            continue
        out.append(f"{rel}::{rest}")
    return out


@pytest.hookimpl(tryfirst=True)  # before pytest's -m selection, which then sees the markers added here
def pytest_collection_modifyitems(config, items):
    # Tiers. GPU tests are never tiered; a sampled test's cases outside the sample get the `full` marker, every
    # hypothesis test the `deep` marker (it runs in both tiers, at a larger depth in the full one).
    groups: dict = {}
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            continue
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.deep)
        mark = item.get_closest_marker("sample")
        if mark is not None:
            key = (item.path, getattr(item, "cls", None), getattr(item, "originalname", item.name))
            groups.setdefault(key, (mark, []))[1].append(item)
    for mark, group in groups.values():
        n, cover = _check_sample_marker(group[0], mark)
        keep = _sample(group, n, cover)
        for i, item in enumerate(group):
            if i not in keep:
                item.add_marker(pytest.mark.full)
    if not FULL:
        # A test named on the command line (FILE::TEST, FILE::TEST[ID]) runs whatever its tier.
        named = _named(config)
        kept, deselected = [], []
        for item in items:
            full = item.get_closest_marker("full") is not None and item.get_closest_marker("gpu") is None
            if full and any(item.nodeid == n or item.nodeid.startswith((n + "[", n + "::")) for n in named):
                full = False
            (deselected if full else kept).append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept

    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    if FULL:
        return "gdnjit test tier: full (GDNJIT_TEST_FULL set): every test, fuzz tests at depth"
    return "gdnjit test tier: default (GDNJIT_TEST_FULL=1 runs the full tier: README, tests/conftest.py)"


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
