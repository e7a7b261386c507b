"""Tuned-table lookup: nearest batch size within a factor of 2, else the rules decide."""

from __future__ import annotations

from gdnjit.tuned import MAX_B_RATIO, TunedTable

PARAMS = {"layout": "klast", "T": 2}


def _entry(B: int, tile: int, params=PARAMS, H=16, HV=64) -> dict:
    return {"spec": "gdn", "params": params, "facts": {"B": B, "H": H, "HV": HV}, "tunables": {"tile_v": tile}}


def _pick(table: TunedTable, B: int, params=PARAMS, H=16, HV=64):
    got = table.lookup("gdn", params, {"B": B, "H": H, "HV": HV, "num_sms": 132})
    return None if got is None else got["tile_v"]


def test_nearest_batch_in_log_scale_ties_to_the_smaller():
    t = TunedTable([_entry(1, 8), _entry(4, 16), _entry(32, 32), _entry(128, 64)])
    assert [_pick(t, B) for B in (1, 2, 3, 4, 8)] == [8, 8, 16, 16, 16]  # 2: 2x from 1 and from 4
    assert [_pick(t, B) for B in (16, 32, 64, 65, 256)] == [32, 32, 32, 64, 64]  # 64: 2x from 32 and from 128


def test_no_entry_beyond_the_ratio():
    assert MAX_B_RATIO == 2
    t = TunedTable([_entry(1, 8), _entry(8, 16)])
    assert _pick(t, 2) == 8 and _pick(t, 3) is None and _pick(t, 4) == 16 and _pick(t, 16) == 16
    assert _pick(t, 17) is None and _pick(t, 512) is None
    assert TunedTable([_entry(64, 32)]).lookup("gdn", PARAMS, {"B": 31, "H": 16, "HV": 64}) is None
    assert _pick(TunedTable([_entry(64, 32)]), 32) == 32


def test_other_params_heads_or_spec_do_not_match():
    t = TunedTable([_entry(1, 8)])
    assert _pick(t, 1, params={"layout": "klast", "T": 4}) is None
    assert _pick(t, 1, HV=32) is None and _pick(t, 1, H=8) is None
    assert t.lookup("nvfp4_quantize", PARAMS, {"B": 1, "H": 16, "HV": 64}) is None


def test_first_file_wins_at_equal_batch():
    t = TunedTable([_entry(8, 16), _entry(8, 32)])
    assert _pick(t, 8) == 16 and len(t) == 2


def test_covers_says_whether_any_batch_size_can_match():
    """What warm's planner asks once per problem before looking a table up at each batch size."""
    t = TunedTable([_entry(8, 16)])
    assert t.covers("gdn", PARAMS, {"H": 16, "HV": 64}) and t.covers("gdn", PARAMS, {"H": 16, "HV": 64, "B": 512})
    assert not t.covers("gdn", PARAMS, {"H": 16, "HV": 32}) and not t.covers("gdn", {"layout": "klast", "T": 4},
                                                                            {"H": 16, "HV": 64})
    assert not t.covers("nvfp4_quantize", PARAMS, {"H": 16, "HV": 64}) and not t.covers("nope", PARAMS, {})
    for B in (1, 4, 8, 16, 17, 512):  # covers is the union of lookup's hits over the batch sizes
        assert (_pick(t, B) is not None) <= t.covers("gdn", PARAMS, {"H": 16, "HV": 64})
