"""The validated records of the shipped specs (gdnjit/spec_record.py): fresh, equal to a full parse, and
ignored for any other bytes."""

from __future__ import annotations

import json

import pytest

from gdnjit import spec_record
from gdnjit.spec import SPEC_DIR, get_spec, list_specs, load_spec_file, recorded_spec


@pytest.mark.parametrize("name", list_specs())
def test_records_are_fresh_and_equal_a_full_parse(name):
    path = SPEC_DIR / f"{name}.yaml"
    rec = recorded_spec(path.name, path.read_bytes())
    assert rec is not None, f"gdnjit/specs/validated.json is stale for {path.name}: run python -m gdnjit.spec_record"
    parsed = load_spec_file(path)
    assert rec == parsed and hash(rec) == hash(parsed)
    assert get_spec(name) == parsed


def test_other_bytes_are_parsed():
    path = SPEC_DIR / "gdn.yaml"
    text = path.read_bytes()
    assert recorded_spec(path.name, text + b"\n# edited\n") is None
    assert recorded_spec("other.yaml", text) is None


def test_every_shipped_spec_has_a_record_and_nothing_else():
    recorded = json.loads(spec_record.RECORDS.read_text())
    assert sorted(recorded) == sorted(f"{n}.yaml" for n in list_specs())


def test_the_digest_covers_the_validator_code(monkeypatch):
    before = spec_record.digest(b"x")
    monkeypatch.setattr(spec_record, "_validator_digest", lambda: b"other code")
    assert spec_record.digest(b"x") != before


def _fresh_analysis(text):
    """expr.analyse with every memo and seed of gdnjit.expr out of the way (a parse from scratch)."""
    from gdnjit import expr

    saved = dict(expr._SEEDS)
    expr._SEEDS.clear()
    for fn in (expr.check_expr, expr.conjuncts, expr._fast):
        fn.cache_clear()
    try:
        return expr.analyse(text)
    finally:
        expr._SEEDS.update(saved)


@pytest.mark.parametrize("name", list_specs())
def test_recorded_expression_analyses_equal_a_fresh_parse(name):
    """A record seeds gdnjit.expr with each expression's names, conjuncts and compiler: each must equal what
    parsing the text gives, and the record must cover every expression of the spec and every conjunct."""
    recorded = json.loads(spec_record.RECORDS.read_text())[f"{name}.yaml"]["expressions"]
    spec = load_spec_file(SPEC_DIR / f"{name}.yaml")
    assert set(spec.expressions()) <= set(recorded)
    for text, (names, parts, fast) in recorded.items():
        assert (tuple(names), tuple(parts), fast) == _fresh_analysis(text), text
        assert set(parts) <= set(recorded)


def test_a_seeded_expression_evaluates_like_a_parsed_one():
    from gdnjit import expr

    spec = get_spec("gdn")  # seeds its expressions
    text = next(t for t in spec.expressions() if len(expr.conjuncts(t)) > 1)
    assert text in expr._SEEDS
    expr.compile_expr.cache_clear()
    values = {n: 1 for n in expr.names_in(text)}
    seeded = expr.compile_expr(text)(**values)
    saved = dict(expr._SEEDS)
    expr._SEEDS.clear()
    expr.compile_expr.cache_clear()
    try:
        assert expr.compile_expr(text)(**values) == seeded
    finally:
        expr._SEEDS.update(saved)
        expr.compile_expr.cache_clear()
