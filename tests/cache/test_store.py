"""The on-disk cache (gdnjit/cache/store.py): hits and misses, locking, corruption recovery,
read-only dirs, the knobs, temp files, and real multi-process races (CPU only; NVRTC compiles
sm_90 cubins without a GPU).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import filelock
import pytest

from gdnjit import runner
from gdnjit.gdn import NATIVE_CONVENTIONS
from gdnjit.cache import store
from gdnjit.cache.key import CACHE_FORMAT, cache_key
from gdnjit.cache.store import Built, DiskCache
from gdnjit.errors import CacheMissError, LockTimeoutError
from gdnjit.spec import get_spec
from gdnjit.variant import Variant

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60  # seconds; a child that takes longer is hung

# Helpers shared verbatim with the child processes (exec'd here and prepended to every child script).
COMMON = r'''
import hashlib, json, os, sys, time
from pathlib import Path
from gdnjit.cache.key import CACHE_FORMAT, cache_key, entry_name
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config


def fake_fields(i):
    """Complete key fields of a fake entry number ``i`` (no spec, no NVRTC)."""
    return {
        "format": CACHE_FORMAT, "gdnjit_version": "test", "spec": "fake", "template": "fake.cu.j2",
        "template_hash": "0" * 64, "kernel_name": "fake_kernel", "params": {"i": i}, "tunables": {},
        "arch": "sm_90", "nvrtc_version": "0.0", "options": [], "args": [], "values": {},
    }


def fake_name(fields):
    return entry_name(f"fake-{fields['params']['i']}", cache_key(fields))


def cubin_for(i, tag="v1"):
    """Deterministic fake cubin bytes for entry ``i``."""
    seed = f"{tag}:{i}".encode()
    return b"\x7fELF" + b"".join(hashlib.sha256(seed + bytes([n])).digest() for n in range(64))


FAKE_META = {"registers": 40, "spill_bytes": 0, "stack_bytes": 0, "smem_bytes": 0, "variant": "fake"}


def make_cache(cache_dir, **env):
    return DiskCache(load_config({"GDNJIT_CACHE_DIR": str(cache_dir), **{k: str(v) for k, v in env.items()}}))


def wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)
'''
_common: dict[str, Any] = {}
exec(COMMON, _common)
fake_fields, fake_name, cubin_for = _common["fake_fields"], _common["fake_name"], _common["cubin_for"]
FAKE_META, make_cache = _common["FAKE_META"], _common["make_cache"]

BASE_PARAMS = dict(
    layout="klast", K=128, V=128, T=1, in_dtype="bf16", out_dtype="bf16", state_dtype="fp32",
    dtb_dtype="fp32", pool=False, idx_dtype="int32", same_pool=True, inter_dtype="none",
    ssm_idx_dtype="none", update=True, l2norm=True, slot_strided=False, **NATIVE_CONVENTIONS,
)
BASE_TUNABLES = dict(lanes_per_row=8, ilp=2, tile_v=32)


def base_tunables(spec) -> dict[str, Any]:
    """BASE_TUNABLES, completed with the first valid value of any tunable the spec has gained since."""
    for choice in spec.all_tunable_choices():
        if all(choice.get(n) == v for n, v in BASE_TUNABLES.items() if n in choice) and not spec.violations(
            BASE_PARAMS, choice
        ):
            return choice
    raise AssertionError("no valid tunables extend BASE_TUNABLES")


def real_variant(arch: str = "sm_90") -> Variant:
    spec = get_spec("gdn")
    return Variant.make(spec, BASE_PARAMS, base_tunables(spec), arch)


class Builder:
    """A cheap build callback that counts its calls."""

    def __init__(self, i: int, tag: str = "v1", source: str | None = None):
        self.i, self.tag, self.source, self.calls = i, tag, source, 0

    def __call__(self) -> Built:
        self.calls += 1
        return Built(cubin=cubin_for(self.i, self.tag), meta=dict(FAKE_META), source=self.source)


def must_not_build() -> Built:
    raise AssertionError("build must not be called")


def entry(i: int):
    f = fake_fields(i)
    return f, cache_key(f), fake_name(f)


def files_in(d: Path) -> set[str]:
    return set(os.listdir(d)) if d.is_dir() else set()


def temps_in(d: Path) -> list[str]:
    return sorted(n for n in files_in(d) if n.startswith(".tmp-") or ".tmp" in n)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn(script: str, *args: Any, **kw) -> subprocess.Popen:
    """Start ``python -c COMMON+script`` with JSON args in argv[1]."""
    code = COMMON + "\nARGS = json.loads(sys.argv[1])\n" + textwrap.dedent(script)
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps([str(a) if isinstance(a, Path) else a for a in args])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(REPO), **kw,
    )


def wait_for_child_signal(path: Path, proc: subprocess.Popen, timeout: float = CHILD_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"child exited early ({proc.returncode}):\n{out}\n{err}")
        assert time.monotonic() < deadline, f"child did not signal {path}"
        time.sleep(0.005)


def finish(proc: subprocess.Popen, input: str | None = None) -> str:
    out, err = proc.communicate(input=input, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out}\n{err}"
    return out


@pytest.fixture
def kill_children():
    """Processes registered here are killed (by pid) at teardown if still running."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.communicate(timeout=10)
        except Exception:  # noqa: BLE001
            pass


# ---- miss -> build -> hit --------------------------------------------------------------------


def test_miss_builds_once_then_hits(tmp_path):
    c = make_cache(tmp_path / "cache")
    f, key, name = entry(1)
    assert c.lookup(name, key) is None
    b = Builder(1)
    e = c.get_or_build(name, f, b)
    assert b.calls == 1
    assert (e.name, e.origin, e.cubin) == (name, "built", cubin_for(1))

    assert files_in(c.dir) == {f"{name}.cubin", f"{name}.json"}
    assert (c.dir / f"{name}.cubin").read_bytes() == cubin_for(1)

    again = c.get_or_build(name, f, b)
    assert b.calls == 1  # a hit: not built again
    assert (again.origin, again.cubin) == ("disk", cubin_for(1))
    assert again.meta == e.meta

    # a fresh cache object (another process would do the same) also hits
    fresh = make_cache(tmp_path / "cache")
    hit = fresh.lookup(name, key)
    assert hit is not None and hit.origin == "disk" and hit.cubin == cubin_for(1)
    assert fresh.get_or_build(name, f, must_not_build).cubin == cubin_for(1)


def test_sidecar_contents(tmp_path):
    c = make_cache(tmp_path / "cache")
    f, key, name = entry(2)
    t0 = time.time()
    c.get_or_build(name, f, Builder(2))
    text = (c.dir / f"{name}.json").read_text()
    meta = json.loads(text)
    assert meta["key"] == key
    assert meta["format"] == CACHE_FORMAT
    assert meta["cubin_size"] == len(cubin_for(2))
    assert meta["cubin_sha256"] == hashlib.sha256(cubin_for(2)).hexdigest()
    for k, v in FAKE_META.items():
        assert meta[k] == v
    assert meta["fields"] == f
    assert cache_key(meta["fields"]) == key  # the fields re-hash to the key
    assert t0 - 1 <= meta["created"] <= time.time() + 1
    for p in {str(tmp_path), str(tmp_path.resolve()), str(c.dir)}:
        assert p not in text


def test_entries_with_different_keys_are_separate(tmp_path):
    c = make_cache(tmp_path / "cache")
    (f1, k1, n1), (f2, k2, n2) = entry(1), entry(2)
    assert n1 != n2
    c.get_or_build(n1, f1, Builder(1))
    c.get_or_build(n2, f2, Builder(2))
    assert c.lookup(n1, k1).cubin == cubin_for(1)
    assert c.lookup(n2, k2).cubin == cubin_for(2)
    # the right name with the wrong key is a miss, never the other entry
    assert c.lookup(n1, k2) is None


def test_save_source_writes_the_source_only_when_asked(tmp_path):
    f, _, name = entry(3)
    plain = make_cache(tmp_path / "plain")
    plain.get_or_build(name, f, Builder(3, source="// src"))
    assert files_in(plain.dir) == {f"{name}.cubin", f"{name}.json"}
    saving = make_cache(tmp_path / "saving", GDNJIT_SAVE_SOURCE=1)
    saving.get_or_build(name, f, Builder(3, source="// src"))
    assert files_in(saving.dir) == {f"{name}.cubin", f"{name}.json", f"{name}.cu"}
    assert (saving.dir / f"{name}.cu").read_text() == "// src"


def test_real_nvrtc_compile_through_the_cache(cache_config, tmp_path):
    v = real_variant()
    c = DiskCache(cache_config)
    calls = []

    def build():
        calls.append(1)
        return v.build()

    e = c.get_or_build(v.name, v.key_fields, build)
    assert len(calls) == 1 and e.origin == "built"
    assert e.cubin[:4] == b"\x7fELF"
    assert files_in(c.dir) == {f"{v.name}.cubin", f"{v.name}.json"}

    text = (c.dir / f"{v.name}.json").read_text()
    meta = json.loads(text)
    assert meta["key"] == v.key
    assert meta["cubin_size"] == len(e.cubin)
    assert meta["cubin_sha256"] == hashlib.sha256(e.cubin).hexdigest()
    assert isinstance(meta["registers"], int) and meta["registers"] > 0
    for k in ("spill_bytes", "stack_bytes", "smem_bytes", "compile_s", "source_sha256", "variant", "warnings"):
        assert k in meta, k
    assert cache_key(meta["fields"]) == v.key
    for p in {str(tmp_path), str(tmp_path.resolve()), str(REPO)}:
        assert p not in text

    hit = runner.build_entry(v, cache_config)
    assert hit.origin == "disk" and hit.cubin == e.cubin
    assert c.get_or_build(v.name, v.key_fields, build).cubin == e.cubin
    assert len(calls) == 1

    saving = DiskCache(dataclasses.replace(cache_config, cache_dir=tmp_path / "src", save_source=True))
    saving.get_or_build(v.name, v.key_fields, v.build)
    assert (saving.dir / f"{v.name}.cu").read_text() == v.source()


# ---- locking ---------------------------------------------------------------------------------

_HOLD_THEN_PUBLISH = """
lock_path, cache_dir, other_lock_dir, go, i = ARGS
lock = __import__("filelock").FileLock(lock_path)
lock.acquire()
print("locked", flush=True)
wait_for(go)                 # the parent is about to wait on the lock
time.sleep(0.2)              # ... and is now blocked in it
f = fake_fields(i)
# publish the entry (through a cache whose locks live elsewhere, so it does not wait on our own lock)
c = make_cache(cache_dir, GDNJIT_LOCK_DIR=other_lock_dir)
c.get_or_build(fake_name(f), f, lambda: Built(cubin_for(i, "child"), dict(FAKE_META)))
lock.release()
"""


def test_waits_for_lock_then_rechecks_and_does_not_build(tmp_path, monkeypatch, kill_children):
    c = make_cache(tmp_path / "cache")
    f, key, name = entry(4)
    lock_path = c.config.effective_lock_dir / f"{name}.lock"
    lock_path.parent.mkdir(parents=True)
    go = tmp_path / "go"
    proc = spawn(_HOLD_THEN_PUBLISH, lock_path, tmp_path / "cache", tmp_path / "otherlocks", go, 4)
    kill_children.append(proc)
    assert proc.stdout.readline().strip() == "locked"

    import filelock  # the store imports it on a miss; its FileLock is what it calls

    real_lock = filelock.FileLock

    def lock_spy(path, *a, **kw):  # tells the child that our lookup missed and we now take the lock
        assert str(path) == str(lock_path)
        go.touch()
        return real_lock(path, *a, **kw)

    monkeypatch.setattr(filelock, "FileLock", lock_spy)
    t0 = time.monotonic()
    e = c.get_or_build(name, f, must_not_build)
    waited = time.monotonic() - t0
    finish(proc)
    assert go.exists()
    assert waited >= 0.15, waited
    assert e.origin == "disk"
    assert e.cubin == cubin_for(4, "child")
    assert c.lookup(name, key).cubin == cubin_for(4, "child")


_HOLD_UNTIL_STDIN_CLOSES = """
lock = __import__("filelock").FileLock(ARGS[0])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
"""


def test_lock_timeout_names_the_lock(tmp_path, kill_children):
    lock_dir = tmp_path / "node-local-locks"
    c = make_cache(tmp_path / "cache", GDNJIT_LOCK_TIMEOUT=0.5, GDNJIT_LOCK_DIR=lock_dir)
    f, key, name = entry(5)
    lock_path = lock_dir / f"{name}.lock"
    lock_dir.mkdir()
    proc = spawn(_HOLD_UNTIL_STDIN_CLOSES, lock_path, stdin=subprocess.PIPE)
    kill_children.append(proc)
    assert proc.stdout.readline().strip() == "locked"
    b = Builder(5)
    t0 = time.monotonic()
    with pytest.raises(LockTimeoutError) as info:
        c.get_or_build(name, f, b)
    elapsed = time.monotonic() - t0
    assert isinstance(info.value, TimeoutError)
    assert str(lock_path) in str(info.value)
    assert "GDNJIT_LOCK_TIMEOUT" in str(info.value)
    assert 0.4 <= elapsed < 10, elapsed
    assert b.calls == 0
    assert c.lookup(name, key) is None
    finish(proc, input="")  # closes the child's stdin: it releases the lock and exits
    # once released, the same cache builds normally
    assert c.get_or_build(name, f, b).origin == "built" and b.calls == 1


# ---- corruption ------------------------------------------------------------------------------


def _corrupt(d: Path, name: str, kind: str) -> None:
    cubin, side = d / f"{name}.cubin", d / f"{name}.json"
    if kind == "truncated_cubin":
        data = cubin.read_bytes()
        cubin.write_bytes(data[: len(data) // 2])
    elif kind == "empty_cubin":
        cubin.write_bytes(b"")
    elif kind == "flipped_cubin":  # same size, different bytes: only the sha256 can tell
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 0xFF
        cubin.write_bytes(bytes(data))
    elif kind == "bad_json":
        side.write_text(side.read_text()[:40])
    elif kind == "empty_json":
        side.write_bytes(b"")
    elif kind == "json_not_object":
        side.write_text("[1, 2, 3]")
    elif kind in ("different_key", "wrong_format", "sha_mismatch"):
        meta = json.loads(side.read_text())
        if kind == "different_key":
            meta["key"] = hashlib.sha256(b"another key").hexdigest()
        elif kind == "wrong_format":
            meta["format"] = CACHE_FORMAT + 1
        else:
            meta["cubin_sha256"] = "0" * 64
        side.write_text(json.dumps(meta))
    elif kind == "missing_cubin":
        cubin.unlink()
    elif kind == "missing_sidecar":
        side.unlink()
    else:
        raise ValueError(kind)


CORRUPTIONS = [
    "truncated_cubin", "empty_cubin", "flipped_cubin", "bad_json", "empty_json", "json_not_object",
    "different_key", "wrong_format", "sha_mismatch", "missing_cubin", "missing_sidecar",
]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupt_entry_is_never_loaded_and_is_rebuilt(tmp_path, kind, caplog):
    c = make_cache(tmp_path / "cache")
    f, key, name = entry(6)
    c.get_or_build(name, f, Builder(6))
    _corrupt(c.dir, name, kind)

    with caplog.at_level(logging.WARNING, logger="gdnjit.cache"):
        assert c.lookup(name, key) is None
    if kind != "missing_sidecar":  # a missing sidecar is a plain miss: nothing to warn about
        assert "invalid entry" in caplog.text

    b = Builder(6, "rebuilt")
    e = c.get_or_build(name, f, b)
    assert b.calls == 1 and e.origin == "built" and e.cubin == cubin_for(6, "rebuilt")
    hit = c.lookup(name, key)
    assert hit is not None and hit.cubin == cubin_for(6, "rebuilt")
    assert json.loads((c.dir / f"{name}.json").read_text())["key"] == key
    assert c.verify() == []
    assert temps_in(c.dir) == []
    assert c.get_or_build(name, f, must_not_build).origin == "disk"


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_verify_reports_and_repair_removes_bad_entries(tmp_path, kind):
    c = make_cache(tmp_path / "cache")
    (fg, kg, good), (fb, _, bad) = entry(7), entry(8)
    c.get_or_build(good, fg, Builder(7))
    c.get_or_build(bad, fb, Builder(8))
    assert c.verify() == []
    _corrupt(c.dir, bad, kind)
    before = files_in(c.dir)

    report = c.verify()
    assert [n for n, _ in report] == [bad]
    assert all(isinstance(p, str) and p for _, p in report)
    assert files_in(c.dir) == before  # verify alone changes nothing

    assert [n for n, _ in c.verify(repair=True)] == [bad]
    assert not any(n.startswith(bad) for n in files_in(c.dir))
    assert files_in(c.dir) == {f"{good}.cubin", f"{good}.json"}
    assert c.verify() == []
    assert c.lookup(good, kg).cubin == cubin_for(7)
    assert c.get_or_build(bad, fb, Builder(8)).origin == "built"


def test_clear_removes_entries_and_stray_temps(tmp_path):
    c = make_cache(tmp_path / "cache")
    for i in range(3):
        f, _, name = entry(i)
        c.get_or_build(name, f, Builder(i))
    (c.dir / ".tmp-stray.cubin-xyz").write_bytes(b"x")
    assert c.clear() == 7
    assert files_in(c.dir) == set()
    assert c.verify() == []


# ---- read-only cache dirs --------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple]:
    snap = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        snap[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size, data)
    return snap


def _chmod_tree(root: Path, dir_mode: int, file_mode: int) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(dir_mode if p.is_dir() else file_mode)


def test_readonly_dir_is_served_first_and_never_written(tmp_path):
    ro_root, rw_root = tmp_path / "ro", tmp_path / "rw"
    (f1, k1, n1), (f2, k2, n2), (f3, k3, n3) = entry(9), entry(10), entry(11)
    # the read-only cache ships entry 9 (and a corrupt entry 11); the writable one has its own entry 9
    ro_builder = make_cache(ro_root)
    ro_builder.get_or_build(n1, f1, Builder(9, "ro"))
    ro_builder.get_or_build(n3, f3, Builder(11, "ro"))
    _corrupt(ro_builder.dir, n3, "truncated_cubin")
    make_cache(rw_root).get_or_build(n1, f1, Builder(9, "rw"))

    _chmod_tree(ro_root, 0o555, 0o444)
    try:
        before = _snapshot(ro_root)
        if os.geteuid() != 0:  # root ignores permissions; then the snapshot is the only guard
            with pytest.raises(PermissionError):
                (ro_builder.dir / "probe").write_bytes(b"x")

        c = make_cache(rw_root, GDNJIT_READONLY_CACHE_DIRS=ro_root)
        hit = c.lookup(n1, k1)
        assert hit is not None and hit.origin == "readonly" and hit.cubin == cubin_for(9, "ro")
        e = c.get_or_build(n1, f1, must_not_build)
        assert (e.origin, e.cubin) == ("readonly", cubin_for(9, "ro"))

        # a miss builds into the writable dir only
        b = Builder(10)
        assert c.get_or_build(n2, f2, b).origin == "built" and b.calls == 1
        assert {f"{n2}.cubin", f"{n2}.json"} <= files_in(c.dir)
        assert c.lookup(n2, k2).origin == "disk"

        # a corrupt read-only entry is skipped (not repaired in place) and rebuilt in the writable dir
        assert c.lookup(n3, k3) is None
        b3 = Builder(11, "rw")
        assert c.get_or_build(n3, f3, b3).cubin == cubin_for(11, "rw") and b3.calls == 1
        assert c.lookup(n3, k3).origin == "disk"

        # always_compile overwrites the writable copy, never the read-only one
        forced = DiskCache(dataclasses.replace(c.config, always_compile=True))
        assert forced.get_or_build(n1, f1, Builder(9, "forced")).origin == "built"
        assert (c.dir / f"{n1}.cubin").read_bytes() == cubin_for(9, "forced")
        assert c.lookup(n1, k1).origin == "readonly"  # still served first

        # with JIT disabled the read-only entry is still served
        nojit = DiskCache(dataclasses.replace(c.config, disable_jit=True))
        assert nojit.get_or_build(n1, f1, must_not_build).origin == "readonly"

        # verify/repair only look at the writable dir
        assert c.verify(repair=True) == []
        assert _snapshot(ro_root) == before
    finally:
        _chmod_tree(ro_root, 0o755, 0o644)


def test_readonly_dirs_are_searched_in_order(tmp_path):
    a, b, rw = tmp_path / "a", tmp_path / "b", tmp_path / "rw"
    f, key, name = entry(12)
    make_cache(a).get_or_build(name, f, Builder(12, "a"))
    make_cache(b).get_or_build(name, f, Builder(12, "b"))
    c_ab = make_cache(rw, GDNJIT_READONLY_CACHE_DIRS=f"{a}{os.pathsep}{b}")
    c_ba = make_cache(rw, GDNJIT_READONLY_CACHE_DIRS=f"{b}{os.pathsep}{a}")
    assert c_ab.lookup(name, key).cubin == cubin_for(12, "a")
    assert c_ba.lookup(name, key).cubin == cubin_for(12, "b")
    assert not rw.exists()


# ---- knobs -----------------------------------------------------------------------------------


def test_disable_jit_miss_raises_naming_variant_and_dirs(tmp_path):
    ro = tmp_path / "ro"
    c = make_cache(tmp_path / "cache", GDNJIT_DISABLE_JIT=1, GDNJIT_READONLY_CACHE_DIRS=ro)
    f, key, name = entry(13)
    with pytest.raises(CacheMissError) as info:
        c.get_or_build(name, f, must_not_build)
    msg = str(info.value)
    assert name in msg
    assert str(c.dir) in msg
    assert str(ro / store.ENTRY_DIR) in msg
    assert "GDNJIT_DISABLE_JIT" in msg
    assert not (tmp_path / "cache").exists()  # nothing written, not even the lock dir


def test_disable_jit_serves_hits_but_not_corrupt_entries(tmp_path):
    f, key, name = entry(14)
    make_cache(tmp_path / "cache").get_or_build(name, f, Builder(14))
    c = make_cache(tmp_path / "cache", GDNJIT_DISABLE_JIT=1)
    e = c.get_or_build(name, f, must_not_build)
    assert (e.origin, e.cubin) == ("disk", cubin_for(14))
    _corrupt(c.dir, name, "flipped_cubin")
    with pytest.raises(CacheMissError):
        c.get_or_build(name, f, must_not_build)


def test_always_compile_rebuilds_on_a_hit_and_overwrites(tmp_path):
    f, key, name = entry(15)
    make_cache(tmp_path / "cache").get_or_build(name, f, Builder(15, "old"))
    c = make_cache(tmp_path / "cache", GDNJIT_ALWAYS_COMPILE=1)
    b = Builder(15, "new")
    e = c.get_or_build(name, f, b)
    assert b.calls == 1 and e.origin == "built" and e.cubin == cubin_for(15, "new")
    c.get_or_build(name, f, b)
    assert b.calls == 2
    normal = make_cache(tmp_path / "cache")
    assert normal.lookup(name, key).cubin == cubin_for(15, "new")
    assert normal.verify() == [] and temps_in(normal.dir) == []


def test_disable_disk_cache_writes_nothing(tmp_path):
    c = make_cache(tmp_path / "cache", GDNJIT_DISABLE_DISK_CACHE=1, GDNJIT_SAVE_SOURCE=1)
    f, key, name = entry(16)
    b = Builder(16, source="// src")
    e = c.get_or_build(name, f, b)
    assert (e.origin, e.cubin) == ("built", cubin_for(16))
    assert e.meta["key"] == key and e.meta["cubin_sha256"] == hashlib.sha256(e.cubin).hexdigest()
    c.get_or_build(name, f, b)
    assert b.calls == 2  # nothing was stored, so nothing hits
    assert not (tmp_path / "cache").exists()
    assert list(tmp_path.rglob("*")) == []


# ---- temp files ------------------------------------------------------------------------------


def test_stale_temps_of_an_entry_are_removed_on_publish(tmp_path):
    c = make_cache(tmp_path / "cache")
    (f, key, name), (_, _, other) = entry(17), entry(18)
    c.dir.mkdir(parents=True)
    stale = [f".tmp-{name}.cubin-abc123", f".tmp-{name}.json-def456", f".tmp-{name}.cu-0"]
    foreign = f".tmp-{other}.cubin-zzz"  # another entry's temp: maybe being written under its own lock
    for n in [*stale, foreign]:
        (c.dir / n).write_bytes(b"partial")
    assert c.lookup(name, key) is None  # temps are not an entry
    assert list(c.list_entries()) == []
    c.get_or_build(name, f, Builder(17))
    assert files_in(c.dir) == {f"{name}.cubin", f"{name}.json", foreign}
    assert c.verify() == []


def test_no_temp_files_after_normal_publishes(tmp_path):
    c = make_cache(tmp_path / "cache", GDNJIT_SAVE_SOURCE=1)
    forced = make_cache(tmp_path / "cache", GDNJIT_SAVE_SOURCE=1, GDNJIT_ALWAYS_COMPILE=1)
    names = []
    for i in range(10):
        f, _, name = entry(i)
        names.append(name)
        c.get_or_build(name, f, Builder(i, source=f"// {i}"))
        forced.get_or_build(name, f, Builder(i, "again", source=f"// {i}"))
    assert temps_in(c.dir) == []
    assert files_in(c.dir) == {f"{n}{s}" for n in names for s in (".cubin", ".json", ".cu")}
    lock_files = files_in(c.config.effective_lock_dir)
    assert lock_files <= {f"{n}.lock" for n in names}


# ---- file modes: a cache warmed by one user is read by another -------------------------------


def _with_umask(mask, fn):
    old = os.umask(mask)
    try:
        return fn()
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, mask, mode):
    """Entries, plan records and tuned tables get 0666 less the umask, as any file the user creates (they were
    0600 whatever the umask: tempfile.mkstemp's mode), so a shared warmed dir is readable where the umask says."""
    from gdnjit import plan_record, tuned

    c = make_cache(tmp_path / "cache", GDNJIT_SAVE_SOURCE=1)
    f, _, name = entry(3)

    def write():
        c.get_or_build(name, f, Builder(3, source="// 3"))
        plan_record.save(c.config.cache_dir, "k" * 64, [], 0)
        tuned.write_table(c.config.cache_dir / "tuned" / "t.json", {"entries": []})

    _with_umask(mask, write)
    written = [c.dir / f"{name}{s}" for s in (".cubin", ".json", ".cu")]
    written += [c.config.cache_dir / plan_record.PLAN_DIR / f"{'k' * 64}.json", c.config.cache_dir / "tuned" / "t.json"]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in written} == {p.name: mode for p in written}


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to run a reader as another user")
def test_another_user_reads_a_warmed_shared_cache(tmp_path):
    """docs/deploy.md's fleet set-up: warm into a shared dir, serve as another user through
    GDNJIT_READONLY_CACHE_DIRS. The reader (uid 65534, `nobody`) must be able to read every entry file."""
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="gdnjit-shared-"))  # outside pytest's tmp dirs, which are 0700
    try:
        os.chmod(shared, 0o755)
        c = make_cache(shared / "cache")
        names = []
        for i in range(3):
            f, _, name = entry(i)
            _with_umask(0o022, lambda f=f, name=name, i=i: c.get_or_build(name, f, Builder(i)))
            names.append(name)
        files = [str(c.dir / f"{n}{s}") for n in names for s in (".cubin", ".json")]

        def as_nobody():
            os.setgid(65534)
            os.setuid(65534)

        proc = subprocess.run(["cat", *files], preexec_fn=as_nobody, capture_output=True, timeout=CHILD_TIMEOUT)
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stdout == b"".join(Path(p).read_bytes() for p in files)
    finally:
        import shutil

        shutil.rmtree(shared)


# ---- a write that fails (a full disk): no half entry ---------------------------------------------


@pytest.mark.parametrize("failing", [".cubin", ".cu", ".json"])
def test_a_failed_write_leaves_no_half_entry(tmp_path, monkeypatch, failing):
    import errno

    c = make_cache(tmp_path / "cache", GDNJIT_SAVE_SOURCE=1)
    f, key, name = entry(5)
    real = store.write_atomic

    def write(path, data):
        if path.name.endswith(failing):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(store, "write_atomic", write)
    with pytest.raises(store.CacheWriteError) as e:
        c.get_or_build(name, f, Builder(5, source="// 5"))
    assert str(e.value) == (f"GDNJIT_CACHE_DIR: cannot write entry {name} in '{c.dir}': no space left on device")
    assert files_in(c.dir) == set()  # neither the cubin nor the source stays without its sidecar
    monkeypatch.undo()
    assert c.lookup(name, key) is None
    assert c.get_or_build(name, f, Builder(5)).origin == "built"  # the next try builds it whole


# ---- real processes --------------------------------------------------------------------------

_RACE_FAKE = """
cache_dir, log, ready_dir, go, idx, keys = ARGS
c = make_cache(cache_dir)
Path(ready_dir, str(idx)).touch()
wait_for(go)
out = {}
for i in keys[idx % len(keys):] + keys[:idx % len(keys)]:
    f = fake_fields(i)

    def build(i=i):
        time.sleep(0.3)
        with open(log, "a") as fh:
            fh.write(f"{i} {os.getpid()}\\n")
        return Built(cubin_for(i), dict(FAKE_META))

    e = c.get_or_build(fake_name(f), f, build)
    out[str(i)] = [hashlib.sha256(e.cubin).hexdigest(), e.origin]
print(json.dumps(out))
"""


def _start_together(tmp_path: Path, n: int, script: str, *args: Any) -> list[subprocess.Popen]:
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    procs = [spawn(script, *args[:1], *args[1:2], ready, go, idx, *args[2:]) for idx in range(n)]
    deadline = time.monotonic() + CHILD_TIMEOUT
    while len(files_in(ready)) < n:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"child exited early: {p.communicate()}")
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.01)
    go.touch()
    return procs


def test_six_processes_race_on_three_keys(tmp_path, kill_children):
    cache_dir, log = tmp_path / "cache", tmp_path / "builds.log"
    keys = [21, 22, 23]
    procs = _start_together(tmp_path, 6, _RACE_FAKE, cache_dir, log, keys)
    kill_children.extend(procs)
    results = [json.loads(finish(p)) for p in procs]

    builds = collections.Counter(line.split()[0] for line in log.read_text().splitlines())
    assert builds == {str(i): 1 for i in keys}  # each key compiled exactly once
    expected = {str(i): hashlib.sha256(cubin_for(i)).hexdigest() for i in keys}
    for r in results:
        assert {i: sha for i, (sha, _) in r.items()} == expected
    origins = collections.Counter(origin for r in results for _, origin in r.values())
    assert origins["built"] == len(keys) and origins["disk"] == 6 * len(keys) - len(keys)

    c = make_cache(cache_dir)
    names = {fake_name(fake_fields(i)) for i in keys}
    assert files_in(c.dir) == {f"{n}{s}" for n in names for s in (".cubin", ".json")}
    assert temps_in(c.dir) == []
    assert c.verify() == []
    assert files_in(c.config.effective_lock_dir) <= {f"{n}.lock" for n in names}


_RACE_REAL = """
cache_dir, log, ready_dir, go, idx, params, tunables = ARGS
from gdnjit import runner
from gdnjit import variant as V
from gdnjit.spec import get_spec
original = V.Variant.build

def counting_build(self):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    return original(self)

V.Variant.build = counting_build
v = V.Variant.make(get_spec("gdn"), params, tunables, "sm_90")
v.key  # compute the key (and NVRTC version) before the start line
Path(ready_dir, str(idx)).touch()
wait_for(go)
e = runner.build_entry(v, load_config({"GDNJIT_CACHE_DIR": cache_dir}))
print(json.dumps({"sha": hashlib.sha256(e.cubin).hexdigest(), "created": e.meta["created"],
                  "origin": e.origin, "name": e.name}))
"""


def test_four_processes_race_on_a_real_variant(tmp_path, kill_children):
    v = real_variant()
    cache_dir, log = tmp_path / "cache", tmp_path / "builds.log"
    procs = _start_together(tmp_path, 4, _RACE_REAL, cache_dir, log, dict(BASE_PARAMS), dict(v.tunables))
    kill_children.extend(procs)
    results = [json.loads(finish(p)) for p in procs]

    assert len(log.read_text().splitlines()) == 1  # compiled once
    assert len({r["sha"] for r in results}) == 1
    assert len({r["created"] for r in results}) == 1
    assert sorted(r["origin"] for r in results) == ["built", "disk", "disk", "disk"]
    assert {r["name"] for r in results} == {v.name}

    c = make_cache(cache_dir)
    meta = json.loads((c.dir / f"{v.name}.json").read_text())
    assert meta["created"] == results[0]["created"]
    assert meta["cubin_sha256"] == results[0]["sha"]
    hit = c.lookup(v.name, v.key)
    assert hit is not None and hashlib.sha256(hit.cubin).hexdigest() == results[0]["sha"]
    assert temps_in(c.dir) == [] and c.verify() == []


_KILLED = """
cache_dir, ready, phase, i = ARGS
c = make_cache(cache_dir)
if phase == "publish":
    real_replace = os.replace

    def hanging_replace(src, dst):
        if str(dst).endswith(".json"):  # cubin published, sidecar (the commit marker) not yet
            Path(ready).touch()
            time.sleep(3600)
        return real_replace(src, dst)

    os.replace = hanging_replace


def build():
    if phase == "build":
        Path(ready).touch()
        time.sleep(3600)
    return Built(cubin_for(i, "killed"), dict(FAKE_META))

f = fake_fields(i)
c.get_or_build(fake_name(f), f, build)
"""


@pytest.mark.parametrize("phase", ["build", "publish"])
def test_sigkill_while_holding_the_lock(tmp_path, kill_children, phase):
    cache_dir, ready = tmp_path / "cache", tmp_path / "ready"
    f, key, name = entry(30)
    proc = spawn(_KILLED, cache_dir, ready, phase, 30)
    kill_children.append(proc)
    wait_for_child_signal(ready, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL

    c = make_cache(cache_dir, GDNJIT_LOCK_TIMEOUT=5)
    lock_path = c.config.effective_lock_dir / f"{name}.lock"
    assert lock_path.exists()  # the lock file stays; its flock died with the process
    assert c.lookup(name, key) is None  # nothing loadable
    if phase == "publish":
        assert (c.dir / f"{name}.cubin").exists() and not (c.dir / f"{name}.json").exists()
        assert temps_in(c.dir) != []  # the sidecar's temp file was left behind

    b = Builder(30)
    t0 = time.monotonic()
    e = c.get_or_build(name, f, b)
    assert time.monotonic() - t0 < 4  # the lock did not block
    assert b.calls == 1 and e.origin == "built" and e.cubin == cubin_for(30)
    assert c.lookup(name, key).cubin == cubin_for(30)
    assert temps_in(c.dir) == []
    assert c.verify() == []
    with filelock.FileLock(str(lock_path), timeout=0):  # free again
        pass
