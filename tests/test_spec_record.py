"""The validated records of the shipped specs (gdnjit/spec_record.py): fresh, equal to a full parse, and
ignored for any other bytes."""

from __future__ import annotations

import json

import pytest

from gdnjit import spec_record
from gdnjit.spec import SPEC_DIR, get_spec, list_specs, load_spec_file


@pytest.mark.parametrize("name", list_specs())
def test_records_are_fresh_and_equal_a_full_parse(name):
    path = SPEC_DIR / f"{name}.yaml"
    rec = spec_record.recorded(path.name, path.read_bytes())
    assert rec is not None, f"gdnjit/specs/validated.json is stale for {path.name}: run python -m gdnjit.spec_record"
    parsed = load_spec_file(path)
    assert rec == parsed and hash(rec) == hash(parsed)
    assert get_spec(name) == parsed


def test_other_bytes_are_parsed():
    path = SPEC_DIR / "gdn.yaml"
    text = path.read_bytes()
    assert spec_record.recorded(path.name, text + b"\n# edited\n") is None
    assert spec_record.recorded("other.yaml", text) is None


def test_every_shipped_spec_has_a_record_and_nothing_else():
    recorded = json.loads(spec_record.RECORDS.read_text())
    assert sorted(recorded) == sorted(f"{n}.yaml" for n in list_specs())


def test_the_digest_covers_the_validator_code(monkeypatch):
    before = spec_record.digest(b"x")
    monkeypatch.setattr(spec_record, "_validator_digest", lambda: b"other code")
    assert spec_record.digest(b"x") != before
