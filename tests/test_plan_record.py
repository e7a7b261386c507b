"""gdnjit.plan_record: the key covers every input of a plan, records round-trip, bad records are misses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gdnjit import plan_record
from gdnjit.plan_record import Recorded

PACKAGE = Path(plan_record.__file__).parent
BASE = dict(shapes=[b"calls: []\n"], archs=["sm_90"], num_sms=None, tuned=[], batch_invariant=False)


class _V:  # what save() reads of a Variant
    def __init__(self, i: int):
        self.name, self.key = f"v{i}-{i:032x}", f"{i:064x}"

    def describe(self) -> str:
        return f"spec[sm_90](i={self.name})"


@pytest.mark.parametrize("change", [
    dict(shapes=[b"calls: []\n# edited\n"]), dict(shapes=[b"calls: []\n", b"calls: []\n"]), dict(archs=["sm_100a"]),
    dict(archs=["sm_90", "sm_100a"]), dict(num_sms=[132]), dict(tuned=[{"arch": "sm_90", "entries": []}]),
    dict(batch_invariant=True),
], ids=["shapes-bytes", "shapes-count", "arch", "archs", "num-sms", "tuned", "batch-invariant"])
def test_digest_follows_each_input(change):
    assert plan_record.digest(**BASE) == plan_record.digest(**BASE)
    assert plan_record.digest(**dict(BASE, **change)) != plan_record.digest(**BASE)


def test_digest_follows_the_nvrtc_version(monkeypatch):
    import gdnjit.compile

    before = plan_record.digest(**BASE)
    monkeypatch.setattr(gdnjit.compile, "nvrtc_version", lambda: "99.9")
    assert plan_record.digest(**BASE) != before


def test_package_digest_covers_code_specs_and_templates_not_bytecode(tmp_path):
    root = tmp_path / "gdnjit"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    first = plan_record.package_digest(root)
    assert first == plan_record.package_digest(PACKAGE)  # the same files: the same digest
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert plan_record.package_digest.__wrapped__(root) == first
    for rel in ("dispatch.py", "specs/gdn.yaml", "templates/gdn_recurrent.cu.j2", "tuned"):
        copy = tmp_path / rel.replace("/", "_")
        shutil.copytree(root, copy)
        target = copy / rel
        if target.is_dir():
            (target / "extra.json").write_text("{}")
        else:
            target.write_bytes(target.read_bytes() + b"\n")
        assert plan_record.package_digest(copy) != first, rel


def test_save_load_round_trip_and_pruning(tmp_path):
    variants = [_V(i) for i in range(3)]
    plan_record.save(tmp_path, "a" * 64, variants, 7)
    got = plan_record.load(tmp_path, "a" * 64)
    assert got == ([Recorded(v.name, v.key, v.describe()) for v in variants], 7)
    assert plan_record.load(tmp_path, "b" * 64) is None
    assert [p.name for p in (tmp_path / "plans").iterdir()] == ["a" * 64 + ".json"]  # no temp file left
    for i in range(plan_record.KEEP + 3):
        plan_record.save(tmp_path, f"{i:064x}", variants, 1)
    kept = list((tmp_path / "plans").glob("*.json"))
    assert len(kept) == plan_record.KEEP
    assert plan_record.load(tmp_path, f"{plan_record.KEEP + 2:064x}") is not None  # the newest stays
    assert plan_record.clear(tmp_path) == plan_record.KEEP and list((tmp_path / "plans").iterdir()) == []
    assert plan_record.clear(tmp_path / "nowhere") == 0


@pytest.mark.parametrize("text", [
    "", "not json", "[]", '{"format": 1}', '{"format": 2, "digest": "KEY", "problems": 1, "variants": []}',
    '{"format": 1, "digest": "OTHER", "problems": 1, "variants": []}',
    '{"format": 1, "digest": "KEY", "problems": 1, "variants": [{"name": "x"}]}',
    '{"format": 1, "digest": "KEY", "problems": "many", "variants": []}',
    '{"format": 1, "digest": "KEY", "problems": 1, "variants": [3]}',
])
def test_a_bad_record_is_a_miss(tmp_path, text):
    key = "c" * 64
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / f"{key}.json").write_text(text.replace("KEY", key))
    assert plan_record.load(tmp_path, key) is None


def test_a_good_record_parses(tmp_path):
    key = "d" * 64
    (tmp_path / "plans").mkdir()
    doc = {"format": 1, "digest": key, "problems": 2, "variants": [{"name": "n", "key": "k", "description": "d"}]}
    (tmp_path / "plans" / f"{key}.json").write_text(json.dumps(doc))
    assert plan_record.load(tmp_path, key) == ([Recorded("n", "k", "d")], 2)
