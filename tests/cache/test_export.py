"""Shipping a warmed cache: export to an archive, import elsewhere; invalid or hostile members are skipped."""

from __future__ import annotations

import io
import json
import tarfile

from gdnjit.cache.key import cache_key
from gdnjit.cache.store import Built, DiskCache
from gdnjit.config import load_config


def fields(i):
    return {"format": 1, "gdnjit_version": "t", "spec": "s", "template": "t", "template_hash": "h",
            "kernel_name": "k", "params": {"i": i}, "tunables": {}, "arch": "sm_90", "nvrtc_version": "13.0",
            "options": [], "args": [], "values": {}}


def test_export_import_roundtrip_and_hostile_members(tmp_path):
    src = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "a")}))
    names = []
    for i in range(3):
        f = fields(i)
        name = f"e{i}-{cache_key(f)[:32]}"
        src.get_or_build(name, f, lambda i=i: Built(bytes([i]) * 100, {"registers": 1}))
        names.append((name, f))
    archive = tmp_path / "c.tar.gz"
    assert src.export(archive) == 3
    # add a traversal member and a corrupt entry to the archive
    with tarfile.open(archive, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(archive, "w:gz") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
        for arcname, data in (("../evil.json", b"{}"), ("bad-0000.json", json.dumps({"key": "0000"}).encode()),
                              ("bad-0000.cubin", b"x")):
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst = DiskCache(load_config({"GDNJIT_CACHE_DIR": str(tmp_path / "b")}))
    assert dst.import_(archive) == (3, 1)
    assert not (tmp_path / "b" / "evil.json").exists()
    for name, f in names:
        hit = dst.lookup(name, cache_key(f))
        assert hit is not None and hit.cubin == src.lookup(name, cache_key(f)).cubin
    assert dst.verify() == []
