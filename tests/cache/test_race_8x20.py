"""Real processes racing on an empty cache (8 processes x 20 keys, started together), and caches
written by another gdnjit or NVRTC version never being used for the current key."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gdnjit.compile
import gdnjit.variant
import gdnjit.version
from gdnjit.cache.archive import export_archive, import_archive
from gdnjit.cache.key import CACHE_FORMAT, cache_key
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config
from gdnjit.errors import CacheMissError
from gdnjit.gdn import NATIVE_CONVENTIONS
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 120
N_PROCS, N_KEYS = 8, 20

_CHILD = r'''
import hashlib, json, os, sys, time
from pathlib import Path
from gdnjit.cache.key import CACHE_FORMAT, cache_key, entry_name
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config

cache_dir, log, ready, go, idx, n_procs, n_keys = json.loads(sys.argv[1])


def fields(i):
    return {"format": CACHE_FORMAT, "gdnjit_version": "race", "spec": "fake", "template": "fake.cu.j2",
            "template_hash": "0" * 64, "kernel_name": "k", "params": {"i": i}, "tunables": {}, "arch": "sm_90",
            "nvrtc_version": "0.0", "options": [], "args": [], "values": {}}


def cubin(i):
    return b"".join(hashlib.sha256(f"race:{i}:{n}".encode()).digest() for n in range(32))


c = DiskCache(load_config({"GDNJIT_CACHE_DIR": cache_dir}))
Path(ready, str(idx)).touch()
while not os.path.exists(go):
    time.sleep(0.001)
start = idx * n_keys // n_procs  # each process starts elsewhere, so every key is contended
out = {}
for i in [(start + j) % n_keys for j in range(n_keys)]:
    f = fields(i)

    def build(i=i):
        time.sleep(0.05)
        with open(log, "a") as fh:
            fh.write(f"{i} {os.getpid()}\n")
        return Built(cubin(i), {"registers": 1})

    e = c.get_or_build(entry_name(f"race-{i}", cache_key(f)), f, build)
    out[str(i)] = [hashlib.sha256(e.cubin).hexdigest(), e.origin]
print(json.dumps(out))
'''


def _expected_sha(i: int) -> str:
    data = b"".join(hashlib.sha256(f"race:{i}:{n}".encode()).digest() for n in range(32))
    return hashlib.sha256(data).hexdigest()


def test_8_processes_x_20_keys_on_an_empty_cache(tmp_path):
    cache_dir, log, ready, go = tmp_path / "cache", tmp_path / "builds.log", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps([str(cache_dir), str(log), str(ready), str(go), idx, N_PROCS,
                                                       N_KEYS])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
        for idx in range(N_PROCS)
    ]
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while len(os.listdir(ready)) < N_PROCS:  # every child imported gdnjit and waits at the start line
            for p in procs:
                assert p.poll() is None, f"child exited early: {p.communicate()}"
            assert time.monotonic() < deadline, "children did not start"
            time.sleep(0.01)
        assert not cache_dir.exists()  # the cache is empty when the race starts
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=CHILD_TIMEOUT)
            assert p.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    builds = collections.Counter(int(line.split()[0]) for line in log.read_text().splitlines())
    assert builds == {i: 1 for i in range(N_KEYS)}  # each key compiled exactly once
    expected = {str(i): _expected_sha(i) for i in range(N_KEYS)}
    for r in results:  # every process got identical (and the right) bytes for every key
        assert {i: sha for i, (sha, _) in r.items()} == expected
    origins = collections.Counter(origin for r in results for _, origin in r.values())
    assert origins == {"built": N_KEYS, "disk": N_PROCS * N_KEYS - N_KEYS}
    builders = {i: pid for i, pid in (line.split() for line in log.read_text().splitlines())}
    assert len(set(builders.values())) > 1  # the work was spread over several processes

    c = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(cache_dir)}))
    files = os.listdir(c.dir)
    assert not [f for f in files if f.startswith(".tmp") or ".tmp-" in f]  # no temp files remain
    assert len(files) == 2 * N_KEYS  # a cubin and a sidecar per key, nothing else
    assert c.verify() == []
    names = {f.rsplit(".", 1)[0] for f in files}
    assert set(os.listdir(c.config.effective_lock_dir)) <= {f"{n}.lock" for n in names}


# ---- another gdnjit or NVRTC version ------------------------------------------------------------

BASE_PARAMS = dict(
    layout="klast", K=128, V=128, T=1, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32",
    dtb_dtype="fp32", pool=False, idx_dtype="int32", same_pool=True, inter_dtype="none",
    ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS,
)


def _variant() -> Variant:
    """A fresh Variant (key_fields is cached per instance) of the shipped gdn spec."""
    spec = get_spec("gdn")
    from gdnjit import dispatch

    params = {n: BASE_PARAMS.get(n, vals[0]) for n, vals in spec.params}  # robust to params added later
    tunables, _ = dispatch.select(spec, params, {"B": 64, "H": 16, "HV": 32, "num_sms": 132})
    return Variant.make(spec, params, tunables, "sm_90")


def _fake(tag: str):
    return lambda: Built(f"cubin built by {tag}".encode() * 16, {"registers": 1})


@pytest.fixture
def other_version(monkeypatch):
    """Switch the process to look like another gdnjit or NVRTC version (``which``), and back."""

    def switch(which: str) -> None:
        if which == "gdnjit_version":
            monkeypatch.setattr(gdnjit.version, "__version__", "0.0.1-older")
            # variant.py binds the name at import (a real upgrade re-imports it): patch where it is read
            monkeypatch.setattr(gdnjit.variant, "__version__", "0.0.1-older")
        else:
            monkeypatch.setattr(gdnjit.compile, "nvrtc_version", lambda: "12.4")

    yield switch
    monkeypatch.undo()


@pytest.mark.parametrize("field", ["gdnjit_version", "nvrtc_version"])
def test_a_cache_from_another_version_is_never_used(tmp_path, other_version, monkeypatch, field):
    current = _variant()
    cur_fields, cur_key, cur_name = current.key_fields, current.key, current.name

    # a cache written by the other version: the entry for the same variant, a forged copy of it under the
    # current entry name (as if file names had collided), exported and imported too
    other_version(field)
    old = _variant()
    assert old.key_fields[field] != cur_fields[field]
    assert {k for k in cur_fields if old.key_fields[k] != cur_fields[k]} == {field}  # only that field differs
    assert old.key != cur_key and old.name != cur_name
    other_dir = tmp_path / "other"
    other = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(other_dir)}))
    assert other.get_or_build(old.name, old.key_fields, _fake("other")).origin == "built"
    for suffix in (".cubin", ".json"):
        data = (other.dir / f"{old.name}{suffix}").read_bytes()
        (other.dir / f"{cur_name}{suffix}").write_bytes(data)
    archive = tmp_path / "other.tar.gz"
    export_archive(other, archive)
    monkeypatch.undo()

    assert _variant().key == cur_key  # back to the current version
    for cache in (
        DiskCache(load_config({"GDNJIT_CACHE_DIR": str(other_dir)})),  # used directly as the writable dir
        DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "rw"),  # shipped as a read-only dir
                               "GDNJIT_READONLY_CACHE_DIRS": str(other_dir)})),
    ):
        assert cache.lookup(cur_name, cur_key) is None
        with pytest.raises(CacheMissError):  # strict mode: a miss, never the old cubin
            DiskCache(dataclasses.replace(cache.config, disable_jit=True)).get_or_build(
                cur_name, cur_fields, _fake("nobody"))
    imported = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "imported")}))
    import_archive(imported, archive)  # the forged entry fails the name/key check; the old one stays under its own name
    assert imported.lookup(cur_name, cur_key) is None

    built = []
    c = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(other_dir)}))
    e = c.get_or_build(cur_name, cur_fields, lambda: (built.append(1), _fake("current")())[1])
    assert built == [1] and e.origin == "built" and e.cubin.startswith(b"cubin built by current")
    assert e.meta["fields"][field] == cur_fields[field]
    # and the other version's own entry is still there for it, untouched
    assert c.lookup(old.name, cache_key(old.key_fields)).cubin.startswith(b"cubin built by other")


def test_key_fields_carry_both_versions():
    fields = _variant().key_fields
    assert fields["gdnjit_version"] == gdnjit.version.__version__
    assert fields["nvrtc_version"] == gdnjit.compile.nvrtc_version()
    assert fields["format"] == CACHE_FORMAT
