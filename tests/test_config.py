"""Configuration knobs read from the environment (``gdnjit.config``)."""

from __future__ import annotations

import pytest

from gdnjit.config import load_config


@pytest.mark.parametrize("raw, on", [(None, True), ("", True), ("1", True), ("true", True), ("0", False),
                                     ("off", False)])
def test_pdl_flag_defaults_on(raw, on):
    env = {} if raw is None else {"GDNJIT_PDL": raw}
    assert load_config(env).pdl is on


def test_pdl_flag_refuses_other_values():
    with pytest.raises(ValueError, match="GDNJIT_PDL: expected one of 1/0/true/false, got 'sometimes'"):
        load_config({"GDNJIT_PDL": "sometimes"})


def test_flags_refuse_other_values():
    with pytest.raises(ValueError, match="GDNJIT_CHECK_INDICES: expected one of 1/0/true/false, got 'maybe'"):
        load_config({"GDNJIT_CHECK_INDICES": "maybe"})
