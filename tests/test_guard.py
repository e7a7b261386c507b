"""gdnjit.guard: the C++ metadata check behind the ops' hot path (CPU)."""

from __future__ import annotations

import sys

import pytest
import torch

from gdnjit import guard

pytestmark = pytest.mark.skipif(not guard.available(), reason="torch's TensorGuards is unavailable here")


def test_check_compares_every_slot_metadata():
    x, y = torch.randn(2, 3, 8), torch.zeros(5, dtype=torch.int64)
    g = guard.make((x, y))
    assert g.check(torch.randn(2, 3, 8), torch.ones(5, dtype=torch.int64))  # values and pointers do not matter
    assert not g.check(torch.randn(2, 3, 9), y)
    assert not g.check(torch.randn(2, 8, 3).transpose(1, 2), y)
    assert not g.check(x.bfloat16(), y)
    assert not g.check(x, y.int())
    assert not g.check(x, torch.zeros(10, dtype=torch.int64)[::2])
    assert not g.check(x, x)  # one object in two slots
    assert not g.check(x, None)


def test_guard_holds_no_reference():
    x, y = torch.randn(4), torch.randn(4)
    before = sys.getrefcount(x)
    g = guard.make((x, y))
    assert sys.getrefcount(x) == before and g.check(x, y)
