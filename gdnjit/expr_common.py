"""What both evaluators of spec expressions share (:mod:`gdnjit.expr`, Python's; :mod:`gdnjit.expr_jinja`,
Jinja's): the functions an expression may call, the error type, the nesting limit."""

from __future__ import annotations


class ExprError(ValueError):
    """An expression failed to parse or to evaluate."""


def wave_fill_pct(ctas: int, slots: int) -> int:
    """How full, in whole percent (rounded down), ``ctas`` CTAs keep the ``ceil(ctas / slots)`` waves of ``slots``
    they need: 100 for an exact multiple, 54 for 144 CTAs on 132 SMs (docs/perf.md v16b, v16d); 100 when there
    are no CTAs. Integer arithmetic, so ``wave_fill_pct(n, s) < 90`` is exactly ``10 n < 9 s ceil(n / s)``."""
    ctas, slots = int(ctas), int(slots)
    if ctas <= 0:
        return 100
    if slots <= 0:
        raise ValueError(f"wave_fill_pct: slots must be positive, got {slots}")
    return 100 * ctas // (slots * -(-ctas // slots))


GLOBALS = dict(min=min, max=max, abs=abs, int=int, len=len, wave_fill_pct=wave_fill_pct)  # what expressions may call

MAX_PLAIN_DEPTH = 32  # Jinja's generated Python nests ~2 parentheses a level; Python allows 200
