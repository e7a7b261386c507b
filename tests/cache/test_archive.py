"""Shipping a warmed cache (gdnjit/cache/archive.py): export to an archive, import elsewhere. Unsafe members
refuse the archive, sizes are capped before anything is read, a differing local entry is kept unless asked."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile

import pytest

from gdnjit.cache import archive as archive_mod
from gdnjit.cache.archive import ArchiveError, export_archive, import_archive, read_archive
from gdnjit.cache.key import cache_key
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config


def fields(i):
    return {"format": 1, "gdnjit_version": "t", "spec": "s", "template": "t", "template_hash": "h",
            "kernel_name": "k", "params": {"i": i}, "tunables": {}, "arch": "sm_90", "nvrtc_version": "13.0",
            "options": [], "args": [], "values": {}}


def make_cache(root, n, fill=0):
    """A cache at ``root`` with ``n`` small valid entries (cubin bytes ``i + fill``); (cache, [(name, fields)])."""
    cache = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(root)}))
    names = []
    for i in range(n):
        f = fields(i)
        name = f"e{i}-{cache_key(f)[:32]}"
        cache.get_or_build(name, f, lambda i=i: Built(bytes([i + fill]) * 100, {"registers": 1}))
        names.append((name, f))
    return cache, names


def members(path):
    with tarfile.open(path, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def rewrite(path, extra):
    """Append members to an archive: ``extra`` = [(TarInfo, data or None)]."""
    old = members(path)
    with tarfile.open(path, "w:gz") as tar:
        for m, data in [*old, *extra]:
            tar.addfile(m, io.BytesIO(data) if data is not None else None)


def info(name, data=b"", kind=tarfile.REGTYPE, link=""):
    i = tarfile.TarInfo(name)
    i.type, i.linkname, i.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    return i, data if kind == tarfile.REGTYPE else None


def test_export_import_roundtrip(tmp_path):
    src, names = make_cache(tmp_path / "a", 3)
    archive = tmp_path / "c.tar.gz"
    assert export_archive(src, archive) == 3
    rewrite(archive, [info("bad-0000.json", json.dumps({"key": "0000"}).encode()), info("bad-0000.cubin", b"x"),
                      info("README", b"hello")])
    dst = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "b")}))
    res = import_archive(dst, archive)
    assert sorted(res.added) == sorted(n for n, _ in names) and res.contents.invalid == ("bad-0000",)
    assert res.contents.other == ("README",) and res.present == res.kept == res.replaced == ()
    for name, f in names:
        hit = dst.lookup(name, cache_key(f))
        assert hit is not None and hit.cubin == src.lookup(name, cache_key(f)).cubin
    assert dst.verify() == []
    again = import_archive(dst, archive)  # the same entries again: nothing to do
    assert again.added == () and sorted(again.present) == sorted(n for n, _ in names)


@pytest.mark.parametrize("member, why", [
    (info("../evil.json", b"{}"), "'../evil.json' points outside the archive"),
    (info("/etc/evil.json", b"{}"), "'/etc/evil.json' points outside the archive"),
    (info("sub/e.json", b"{}"), "'sub/e.json' has a directory part"),
    (info("link.cubin", kind=tarfile.SYMTYPE, link="/etc/passwd"), "'link.cubin' is a symbolic link"),
    (info("hard.cubin", kind=tarfile.LNKTYPE, link="x"), "'hard.cubin' is a hard link"),
    (info("dev.cubin", kind=tarfile.CHRTYPE), "'dev.cubin' is a device or FIFO"),
    (info("fifo.cubin", kind=tarfile.FIFOTYPE), "'fifo.cubin' is a device or FIFO"),
    (info("sub", kind=tarfile.DIRTYPE), "'sub' is a directory"),
], ids=["dotdot", "absolute", "subdir", "symlink", "hardlink", "chardev", "fifo", "dir"])
def test_an_unsafe_member_refuses_the_archive(tmp_path, member, why):
    src, _ = make_cache(tmp_path / "a", 2)
    archive = tmp_path / "c.tar.gz"
    export_archive(src, archive)
    rewrite(archive, [member, member] if "sub'" in why else [member])
    dst_dir = tmp_path / "b"
    with pytest.raises(ArchiveError) as e:
        import_archive(DiskCache(load_config({"GDNJIT_CACHE_DIR": str(dst_dir)})), archive)
    msg = str(e.value)
    n = 2 if "sub'" in why else 1
    assert msg == (f"archive '{archive}': expected flat regular entry files, got {n} unsafe member(s) "
                   f"({why}{', ...' if n > 1 else ''}); nothing imported")
    assert not dst_dir.exists()  # nothing written, not even the dirs


def test_size_limits_are_checked_before_reading(tmp_path, monkeypatch):
    """A member over the cap is refused from its header: it is never read (here: its data is not even there)."""
    archive = tmp_path / "big.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        i = tarfile.TarInfo("huge-0.cubin")
        i.size = archive_mod.MAX_MEMBER_BYTES + 1
        tar.addfile(i)  # a header only: reading the member would fail, refusing it must not
    with pytest.raises(ArchiveError, match=rf"expected members of at most {archive_mod.MAX_MEMBER_BYTES} bytes, "
                                           rf"got 'huge-0.cubin' of {archive_mod.MAX_MEMBER_BYTES + 1} bytes"):
        read_archive(archive)
    src, _ = make_cache(tmp_path / "a", 3)
    ok = tmp_path / "ok.tar.gz"
    export_archive(src, ok)
    sizes = [m.size for m, _ in members(ok)]
    monkeypatch.setattr(archive_mod, "MAX_ARCHIVE_BYTES", sum(sizes) - 1)
    with pytest.raises(ArchiveError, match=rf"expected at most {sum(sizes) - 1} bytes of members, got more"):
        read_archive(ok)
    monkeypatch.setattr(archive_mod, "MAX_ARCHIVE_BYTES", sum(sizes))
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", len(sizes) - 1)
    with pytest.raises(ArchiveError, match=rf"expected at most {len(sizes) - 1} members, got more"):
        read_archive(ok)
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", len(sizes))
    assert len(read_archive(ok).entries) == 3


def test_a_differing_local_entry_is_kept_unless_replace(tmp_path):
    theirs, names = make_cache(tmp_path / "a", 2, fill=10)
    archive = tmp_path / "c.tar.gz"
    export_archive(theirs, archive)
    mine, _ = make_cache(tmp_path / "b", 1, fill=20)  # entry e0: same name and key, another cubin
    e0, f0 = names[0]
    local = mine.lookup(e0, cache_key(f0)).cubin
    res = import_archive(mine, archive)
    assert res.kept == (e0,) and res.added == (names[1][0],) and res.replaced == ()
    assert mine.lookup(e0, cache_key(f0)).cubin == local
    res = import_archive(mine, archive, replace=True)
    assert res.replaced == (e0,) and res.present == (names[1][0],)
    assert mine.lookup(e0, cache_key(f0)).cubin == theirs.lookup(e0, cache_key(f0)).cubin


def _fifo(p):
    os.mkfifo(p)


def _symlink(p):
    (p.parent / "target").write_bytes(b"keep me")
    p.symlink_to(p.parent / "target")


def _dangling(p):
    p.symlink_to(p.parent / "nowhere")


def _regular(p):
    p.write_bytes(b"keep me")


@pytest.mark.parametrize("make, got", [
    (_fifo, "got a FIFO"), (_symlink, "got a symbolic link"), (_dangling, "got a symbolic link"),
    (_regular, "got an existing file (pass --force to replace it)"),
], ids=["fifo", "symlink", "dangling-symlink", "regular"])
def test_export_refuses_what_it_would_replace(tmp_path, make, got):
    src, _ = make_cache(tmp_path / "a", 1)
    out = tmp_path / "out" / "x.tar.gz"
    out.parent.mkdir()
    make(out)
    before = {p.name: (p.lstat().st_mode, os.readlink(p) if p.is_symlink() else None) for p in out.parent.iterdir()}
    with pytest.raises(ArchiveError) as e:
        export_archive(src, out)
    assert got in str(e.value) and str(e.value).endswith("nothing written")
    after = {p.name: (p.lstat().st_mode, os.readlink(p) if p.is_symlink() else None) for p in out.parent.iterdir()}
    assert after == before  # no temp file left, nothing replaced
    if make in (_symlink, _regular):
        assert (out.parent / ("target" if make is _symlink else "x.tar.gz")).read_bytes() == b"keep me"
    if make is not _regular:  # --force replaces a regular file only
        with pytest.raises(ArchiveError, match=got):
            export_archive(src, out, force=True)


def test_export_force_replaces_a_regular_file(tmp_path):
    src, _ = make_cache(tmp_path / "a", 2)
    out = tmp_path / "x.tar.gz"
    out.write_bytes(b"old")
    assert export_archive(src, out, force=True) == 2
    assert len(read_archive(out).entries) == 2


def test_export_refuses_a_device(tmp_path):
    """/dev/null and /dev/full were replaced by a regular file when root exported to them."""
    src, _ = make_cache(tmp_path / "a", 1)
    for dev in ("/dev/null", "/dev/full"):
        if not os.path.exists(dev):
            continue
        before = os.lstat(dev)
        for force in (False, True):
            with pytest.raises(ArchiveError, match="got a character device; nothing written"):
                export_archive(src, dev, force=force)
        after = os.lstat(dev)
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
