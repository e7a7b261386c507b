"""Cache size limit (``GDNJIT_CACHE_MAX_BYTES``) with least-recently-used eviction: the knob, use
recorded on hits (sidecar mtime), eviction after a publish (never the entry just published, never a
locked one, sidecar before cubin), read-only dirs left alone, ``gdnjit cache ls``/``evict``, and
real processes publishing under a small limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import pytest

from gdnjit import cli
from gdnjit.cache import store
from gdnjit.cache.key import CACHE_FORMAT, cache_key, entry_name
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config, parse_size, set_config

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60
CUBIN_BYTES = 2048  # every fake cubin has this size, so entry sizes are predictable


def fields(i: int) -> dict:
    return {
        "format": CACHE_FORMAT, "gdnjit_version": "test", "spec": "fake", "template": "fake.cu.j2",
        "template_hash": "0" * 64, "kernel_name": "fake_kernel", "params": {"i": i}, "tunables": {},
        "arch": "sm_90", "nvrtc_version": "0.0", "options": [], "args": [], "values": {},
    }


def name_of(i: int) -> str:
    return entry_name(f"fake-{i}", cache_key(fields(i)))


def cubin_for(i: int, tag: str = "v1") -> bytes:
    seed = f"{tag}:{i}".encode()
    return b"".join(hashlib.sha256(seed + bytes([n])).digest() for n in range(CUBIN_BYTES // 32))


def builder(i: int, tag: str = "v1", source: str | None = None):
    return lambda: Built(cubin_for(i, tag), {"registers": 32, "variant": f"fake {i}"}, source)


def must_not_build() -> Built:
    raise AssertionError("build must not be called")


def make_cache(root: Path, **env) -> DiskCache:
    return DiskCache(load_config({"GDNJIT_CACHE_DIR": str(root), **{k: str(v) for k, v in env.items()}}))


def publish(c: DiskCache, i: int, **kw):
    return c.get_or_build(name_of(i), fields(i), builder(i, **kw))


def set_used(c: DiskCache, i: int, t: float) -> None:
    """Pretend entry ``i`` was last used at time ``t`` (its sidecar mtime)."""
    os.utime(c.dir / f"{name_of(i)}.json", (t, t))


def entry_bytes(c: DiskCache, i: int) -> int:
    return sum((c.dir / f"{name_of(i)}{s}").stat().st_size
               for s in (".cubin", ".json", ".cu") if (c.dir / f"{name_of(i)}{s}").exists())


def present(c: DiskCache) -> set[int]:
    """Numbers of the entries whose sidecar and cubin are both there."""
    names = {name_of(i): i for i in range(100)}
    return {names[u.name] for u in c.usage()
            if u.name in names and (c.dir / f"{u.name}.json").exists() and (c.dir / f"{u.name}.cubin").exists()}


def seeded(tmp_path: Path, n: int, **env) -> tuple[DiskCache, int]:
    """An unlimited cache with entries 0..n-1, entry i last used at (1000 + i) (0 is the oldest).
    Returns (a cache object over the same dir with ``env``, the size of one entry)."""
    root = tmp_path / "cache"
    plain = make_cache(root)
    for i in range(n):
        publish(plain, i)
        set_used(plain, i, 1000.0 + i)
    return make_cache(root, **env), entry_bytes(plain, 0)


# ---- the knob ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [
    ("", 0), ("0", 0), ("  ", 0), ("4096", 4096), ("1K", 1024), ("1k", 1024), ("1KiB", 1024), ("1kb", 1024),
    ("500M", 500 << 20), ("2G", 2 << 30), ("2 GiB", 2 << 30), ("1.5G", 3 << 29), ("1T", 1 << 40), ("10B", 10),
    (".5K", 512),
])
def test_parse_size(raw, expected):
    assert parse_size("GDNJIT_CACHE_MAX_BYTES", raw) == expected
    assert load_config({"GDNJIT_CACHE_MAX_BYTES": raw}).cache_max_bytes == expected


@pytest.mark.parametrize("raw", ["-1", "abc", "1P", "1e9", "5 MB x", "0x10", "1,000", "inf", "nan", "1" * 100, "½"])
def test_bad_size_raises_a_clear_value_error(raw):
    with pytest.raises(ValueError) as info:
        load_config({"GDNJIT_CACHE_MAX_BYTES": raw})
    msg = str(info.value)
    assert "GDNJIT_CACHE_MAX_BYTES" in msg and repr(raw) in msg and "500M" in msg


def test_unset_is_unlimited():
    assert load_config({}).cache_max_bytes == 0


# ---- recording use -------------------------------------------------------------------------------


def test_a_hit_touches_the_sidecar_mtime(tmp_path):
    c, _ = seeded(tmp_path, 2)
    side = c.dir / f"{name_of(0)}.json"
    cubin_mtime = (c.dir / f"{name_of(0)}.cubin").stat().st_mtime
    assert side.stat().st_mtime == 1000.0
    t0 = time.time()
    assert c.lookup(name_of(0), cache_key(fields(0))).cubin == cubin_for(0)
    assert side.stat().st_mtime >= t0 - 1
    set_used(c, 0, 1000.0)
    assert c.get_or_build(name_of(0), fields(0), must_not_build).origin == "disk"
    assert side.stat().st_mtime >= t0 - 1
    assert (c.dir / f"{name_of(0)}.cubin").stat().st_mtime == cubin_mtime  # only the sidecar is touched
    assert json.loads(side.read_text())["key"] == cache_key(fields(0))  # and its content is unchanged
    assert (c.dir / f"{name_of(1)}.json").stat().st_mtime == 1001.0  # other entries are not


def test_a_recently_used_entry_is_not_touched_again(tmp_path, monkeypatch):
    c, _ = seeded(tmp_path, 1)
    side = c.dir / f"{name_of(0)}.json"
    recent = time.time() - store.TOUCH_INTERVAL_S / 2
    os.utime(side, (recent, recent))
    calls = []
    real_utime = os.utime  # (store.os is the os module: patching it patches this test's os too)
    monkeypatch.setattr(store.os, "utime", lambda p, *a, **kw: (calls.append(str(p)), real_utime(p, *a, **kw)))
    for _ in range(3):
        assert c.lookup(name_of(0), cache_key(fields(0))) is not None
    assert calls == [] and side.stat().st_mtime == recent  # no metadata write per hit
    old = time.time() - store.TOUCH_INTERVAL_S * 2
    real_utime(side, (old, old))
    c.lookup(name_of(0), cache_key(fields(0)))
    assert calls == [str(side)] and side.stat().st_mtime > recent


def test_a_miss_and_an_invalid_entry_touch_nothing(tmp_path):
    c, _ = seeded(tmp_path, 1)
    (c.dir / f"{name_of(0)}.cubin").write_bytes(b"truncated")
    assert c.lookup(name_of(0), cache_key(fields(0))) is None
    assert (c.dir / f"{name_of(0)}.json").stat().st_mtime == 1000.0


def test_touch_errors_are_ignored(tmp_path, monkeypatch):
    c, _ = seeded(tmp_path, 1)

    def refuse(*a, **kw):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(store.os, "utime", refuse)
    assert c.lookup(name_of(0), cache_key(fields(0))).cubin == cubin_for(0)
    assert c.get_or_build(name_of(0), fields(0), must_not_build).cubin == cubin_for(0)


def test_readonly_dirs_are_never_touched_nor_counted(tmp_path, monkeypatch):
    ro_root = tmp_path / "ro"
    ro = make_cache(ro_root)
    for i in range(5):
        publish(ro, i)
        set_used(ro, i, 1000.0 + i)
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in ro.dir.iterdir()}
    touched = []
    real_utime = os.utime
    monkeypatch.setattr(store.os, "utime", lambda p, *a, **kw: (touched.append(str(p)), real_utime(p, *a, **kw)))

    one = entry_bytes(ro, 0)
    c = make_cache(tmp_path / "rw", GDNJIT_READONLY_CACHE_DIRS=ro_root, GDNJIT_CACHE_MAX_BYTES=int(1.5 * one))
    for i in range(5):
        assert c.get_or_build(name_of(i), fields(i), must_not_build).origin == "readonly"
    assert not any(str(ro_root) in p for p in touched)
    publish(c, 50)  # the read-only dir holds 5 entries (> limit), but only the writable one counts
    assert present(c) == {50}
    assert c.evict().removed == ()
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in ro.dir.iterdir()} == before


# ---- usage -----------------------------------------------------------------------------------


def test_usage_counts_entry_files_only(tmp_path):
    root = tmp_path / "cache"
    c = make_cache(root, GDNJIT_SAVE_SOURCE=1)
    publish(c, 0, source="// the source\n" * 10)
    publish(c, 1)
    (c.dir / f".tmp-{name_of(2)}.cubin-abc").write_bytes(b"x" * 5000)  # a temp file is not an entry
    (c.dir / "README").write_text("not an entry")
    (c.dir / f"{name_of(3)}.cubin").write_bytes(b"y" * 300)  # an orphan cubin (no sidecar)
    by_name = {u.name: u for u in c.usage()}
    assert set(by_name) == {name_of(0), name_of(1), name_of(3)}
    assert by_name[name_of(0)].bytes == entry_bytes(c, 0) > entry_bytes(c, 1)
    assert (c.dir / f"{name_of(0)}.cu").stat().st_size > 0
    assert by_name[name_of(1)].bytes == CUBIN_BYTES + (c.dir / f"{name_of(1)}.json").stat().st_size
    assert by_name[name_of(1)].last_used == (c.dir / f"{name_of(1)}.json").stat().st_mtime
    assert by_name[name_of(3)] == store.EntryUsage(name_of(3), 300, 0.0)
    assert make_cache(tmp_path / "nothing").usage() == []


# ---- eviction after a publish ------------------------------------------------------------------


def test_unlimited_never_evicts(tmp_path):
    c, _ = seeded(tmp_path, 6)
    publish(c, 10)
    assert present(c) == {0, 1, 2, 3, 4, 5, 10}
    res = c.evict()
    assert (res.limit, res.removed, res.before, res.after) == (0, (), res.before, res.before)


def test_publish_over_the_limit_evicts_least_recently_used(tmp_path):
    c0, one = seeded(tmp_path, 5)
    c = make_cache(tmp_path / "cache", GDNJIT_CACHE_MAX_BYTES=int(4.5 * one))  # room for 4 entries
    publish(c, 10)  # 6 entries: the two oldest (0, 1) go
    assert present(c) == {2, 3, 4, 10}
    assert sum(u.bytes for u in c.usage()) <= 4.5 * one
    publish(c, 11)
    assert present(c) == {3, 4, 10, 11}
    assert c.lookup(name_of(10), cache_key(fields(10))).cubin == cubin_for(10)
    # an evicted entry is a plain miss: rebuilt on demand (and then something else goes)
    b = []
    e = c.get_or_build(name_of(0), fields(0), lambda: (b.append(1), builder(0)())[1])
    assert b == [1] and e.origin == "built"
    assert 0 in present(c) and len(present(c)) == 4
    assert c.verify() == []
    assert not [n for n in os.listdir(c.dir) if n.startswith(".tmp")]


def test_a_hit_makes_an_entry_recently_used(tmp_path):
    c, one = seeded(tmp_path, 4, GDNJIT_CACHE_MAX_BYTES=0)
    assert c.lookup(name_of(0), cache_key(fields(0))) is not None  # 0 was the oldest; now the newest
    limited = make_cache(tmp_path / "cache", GDNJIT_CACHE_MAX_BYTES=int(4.5 * one))
    publish(limited, 10)
    assert present(limited) == {0, 2, 3, 10}  # 1 went instead


def test_the_entry_just_published_is_kept_even_alone_over_the_limit(tmp_path):
    c, one = seeded(tmp_path, 3, GDNJIT_CACHE_MAX_BYTES=100)  # smaller than any entry
    e = publish(c, 10)
    assert e.origin == "built" and present(c) == {10}
    assert c.lookup(name_of(10), cache_key(fields(10))).cubin == cubin_for(10)
    # a rebuild of a present entry (always_compile) keeps it too
    forced = make_cache(tmp_path / "cache", GDNJIT_CACHE_MAX_BYTES=100, GDNJIT_ALWAYS_COMPILE=1)
    publish(forced, 10, tag="again")
    assert present(c) == {10}


def test_eviction_stops_as_soon_as_the_cache_fits(tmp_path):
    c, one = seeded(tmp_path, 8)
    sizes = {i: entry_bytes(c, i) for i in range(8)}
    total = sum(u.bytes for u in c.usage())
    assert total == sum(sizes.values())
    res = c.evict(total - 1)  # one byte too many: exactly one entry (the oldest) goes
    assert res.removed == (name_of(0),) and res.before == total and res.after == total - sizes[0]
    last3 = sizes[5] + sizes[6] + sizes[7]
    res = c.evict(last3)
    assert res.removed == tuple(name_of(i) for i in range(1, 5)) and res.after == last3
    assert present(c) == {5, 6, 7}
    assert c.evict(last3).removed == ()


def sizes_of(c: DiskCache, *numbers: int) -> int:
    """Exact bytes of these entries (sizes differ by a few bytes: the sidecar holds a timestamp)."""
    return sum(entry_bytes(c, i) for i in numbers)


def test_keep_and_ties(tmp_path):
    c, one = seeded(tmp_path, 4)
    for i in range(4):
        set_used(c, i, 5000.0)  # same mtime: ties go by name, deterministically
    by_name = sorted(range(4), key=name_of)
    res = c.evict(sizes_of(c, by_name[0], by_name[3]), keep=[name_of(by_name[0])])
    assert res.removed == tuple(name_of(i) for i in by_name[1:3])


def test_orphans_go_first(tmp_path):
    c, one = seeded(tmp_path, 3)
    (c.dir / f"{name_of(9)}.cubin").write_bytes(b"z" * 100)  # a cubin without sidecar (killed publisher)
    res = c.evict(sizes_of(c, 0, 1, 2))
    assert res.removed == (name_of(9),)
    assert not (c.dir / f"{name_of(9)}.cubin").exists() and present(c) == {0, 1, 2}


def test_sidecar_is_deleted_before_the_cubin(tmp_path, monkeypatch):
    c, one = seeded(tmp_path, 3, GDNJIT_SAVE_SOURCE=1)
    order = []
    real_unlink = Path.unlink

    def spy(self, *a, **kw):
        order.append(self.name)
        return real_unlink(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", spy)
    c.evict(2 * one)
    n0 = name_of(0)
    assert [x for x in order if x.startswith(n0)] == [f"{n0}.json", f"{n0}.cubin", f"{n0}.cu"]


def test_a_half_deleted_entry_is_a_miss_never_loaded(tmp_path, monkeypatch):
    """Eviction dies after removing the sidecar: the cubin left behind is never served."""
    c, one = seeded(tmp_path, 3)
    real_unlink = Path.unlink

    def dies_on_cubin(self, *a, **kw):
        if self.suffix == ".cubin":
            raise OSError("simulated crash between the two deletions")
        return real_unlink(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", dies_on_cubin)
    with pytest.raises(OSError):
        c.evict(2 * one)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert (c.dir / f"{name_of(0)}.cubin").exists() and not (c.dir / f"{name_of(0)}.json").exists()
    assert c.lookup(name_of(0), cache_key(fields(0))) is None
    assert c.get_or_build(name_of(0), fields(0), builder(0, "rebuilt")).cubin == cubin_for(0, "rebuilt")
    # the entry lock was released despite the failure
    with filelock.FileLock(str(c.config.effective_lock_dir / f"{name_of(0)}.lock"), timeout=0):
        pass


def test_eviction_errors_never_fail_a_publish(tmp_path, monkeypatch, caplog):
    c, one = seeded(tmp_path, 3, GDNJIT_CACHE_MAX_BYTES=1)

    def broken(self, *a, **kw):
        raise PermissionError("no")

    monkeypatch.setattr(DiskCache, "_delete_entry", broken)
    e = publish(c, 10)
    assert e.origin == "built" and e.cubin == cubin_for(10)
    assert "size limit not applied" in caplog.text


def _hold(lock_path: Path):
    """A child process that holds ``lock_path`` until its stdin closes."""
    code = textwrap.dedent("""
        import sys, filelock
        lock = filelock.FileLock(sys.argv[1]); lock.acquire()
        print("locked", flush=True); sys.stdin.read(); lock.release()
    """)
    p = subprocess.Popen([sys.executable, "-c", code, str(lock_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_locked_entries_are_skipped_not_waited_for(tmp_path):
    c, one = seeded(tmp_path, 5, GDNJIT_LOCK_TIMEOUT=30)
    lock_dir = c.config.effective_lock_dir
    lock_dir.mkdir(parents=True, exist_ok=True)
    holder = _hold(lock_dir / f"{name_of(0)}.lock")  # another process is (re)building entry 0
    try:
        same_process = filelock.FileLock(str(lock_dir / f"{name_of(1)}.lock"))  # ... and a thread of ours entry 1
        with same_process:
            t0 = time.monotonic()
            res = c.evict(sizes_of(c, 0, 1, 4))
            assert time.monotonic() - t0 < 5
        assert res.skipped == (name_of(0), name_of(1))
        assert res.removed == (name_of(2), name_of(3))
        assert present(c) == {0, 1, 4}
    finally:
        holder.communicate(input="", timeout=CHILD_TIMEOUT)
    assert c.evict(sizes_of(c, 1, 4)).removed == (name_of(0),)  # released: now it goes


def test_lock_files_stay(tmp_path):
    c, one = seeded(tmp_path, 4)
    c.evict(one)
    locks = set(os.listdir(c.config.effective_lock_dir))
    assert {f"{name_of(i)}.lock" for i in range(3)} <= locks  # never deleted: others may hold them


# ---- command line ------------------------------------------------------------------------------


def run_cli(argv, monkeypatch, **env):
    for k in list(os.environ):
        if k.startswith("GDNJIT_"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    set_config(None)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    finally:
        set_config(None)
    return rc, out.getvalue(), err.getvalue()


def test_cli_ls_shows_sizes_and_total(tmp_path, monkeypatch):
    c, one = seeded(tmp_path, 3)
    root = tmp_path / "cache"
    rc, out, err = run_cli(["cache", "ls"], monkeypatch, GDNJIT_CACHE_DIR=root, GDNJIT_CACHE_MAX_BYTES="1M")
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 3
    for i in range(3):
        line = next(x for x in lines if x.split()[1] == name_of(i))
        assert f"size={entry_bytes(c, i)} " in line and "used=" in line
    total = sum(entry_bytes(c, i) for i in range(3))
    assert f"rw total: 3 entries, {total} bytes" in err and str(c.dir) in err and "limit 1.0 MiB" in err


def test_cli_evict(tmp_path, monkeypatch):
    c, one = seeded(tmp_path, 6)
    root = tmp_path / "cache"
    rc, out, _ = run_cli(["cache", "evict"], monkeypatch, GDNJIT_CACHE_DIR=root)
    assert rc == 0 and "no size limit" in out and present(c) == set(range(6))

    rc, out, _ = run_cli(["cache", "evict"], monkeypatch, GDNJIT_CACHE_DIR=root,
                         GDNJIT_CACHE_MAX_BYTES=sizes_of(c, 2, 3, 4, 5))
    assert rc == 0 and present(c) == {2, 3, 4, 5}
    assert [x.split()[1] for x in out.splitlines() if x.startswith("evicted fake")] == [name_of(0), name_of(1)]
    assert "evicted 2 entries" in out

    rc, out, _ = run_cli(["cache", "evict", "--max-bytes", str(sizes_of(c, 5))], monkeypatch, GDNJIT_CACHE_DIR=root,
                         GDNJIT_CACHE_MAX_BYTES="1G")
    assert rc == 0 and present(c) == {5}

    rc, _, err = run_cli(["cache", "evict", "--max-bytes", "lots"], monkeypatch, GDNJIT_CACHE_DIR=root)
    assert rc == 2 and "--max-bytes" in err and present(c) == {5}


def test_cli_bad_env_value_is_reported(tmp_path, monkeypatch):
    rc, _, err = run_cli(["cache", "ls"], monkeypatch, GDNJIT_CACHE_DIR=tmp_path, GDNJIT_CACHE_MAX_BYTES="-5")
    assert rc == 2 and "GDNJIT_CACHE_MAX_BYTES" in err


# ---- real processes under a small limit --------------------------------------------------------

_CHILD = r'''
import hashlib, json, os, sys, time
from pathlib import Path
sys.path.insert(0, os.environ["TEST_DIR"])
from test_evict import builder, cubin_for, fields, name_of
from gdnjit.cache.store import DiskCache
from gdnjit.config import load_config

cache_dir, limit, go, idx, keys = json.loads(sys.argv[1])
c = DiskCache(load_config({"GDNJIT_CACHE_DIR": cache_dir, "GDNJIT_CACHE_MAX_BYTES": str(limit)}))
while not os.path.exists(go):
    time.sleep(0.005)
bad, built = [], 0
for rnd in range(3):
    for i in keys[idx:] + keys[:idx]:
        e = c.get_or_build(name_of(i), fields(i), builder(i))
        built += e.origin == "built"
        if e.cubin != cubin_for(i):
            bad.append(i)
print(json.dumps([bad, built]))
'''


def test_processes_publishing_under_a_small_limit(tmp_path):
    """4 processes x 12 keys x 3 rounds with room for 4 entries: entries come and go constantly; every
    process always gets the right bytes, nothing invalid or half-deleted remains, and a final evict fits."""
    root, go = tmp_path / "cache", tmp_path / "go"
    probe = make_cache(tmp_path / "probe")
    publish(probe, 0)
    one = entry_bytes(probe, 0)
    limit = 4 * one + one // 2
    keys = list(range(12))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TEST_DIR"] = str(Path(__file__).parent)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps([str(root), limit, str(go), i, keys])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
             for i in range(4)]
    try:
        time.sleep(0.3)
        go.touch()
        built = 0
        for p in procs:
            out, err = p.communicate(timeout=CHILD_TIMEOUT)
            assert p.returncode == 0, err
            bad, n = json.loads(out)
            assert bad == [], out
            built += n
        assert built > len(keys)  # entries were evicted and rebuilt: the limit was at work
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    c = make_cache(root, GDNJIT_CACHE_MAX_BYTES=limit)
    assert c.verify() == []  # no half-deleted or invalid entry
    assert not [n for n in os.listdir(c.dir) if n.startswith(".tmp")]
    c.evict()
    assert sum(u.bytes for u in c.usage()) <= limit
    assert 1 <= len(present(c)) <= 4
