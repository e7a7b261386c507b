"""The dispatcher: pick a spec's tunables for one call from its ordered rules.

Rules are tried in order; the first whose ``when`` holds over the runtime facts and params and
whose tunables satisfy the spec's constraints for these params wins. A tuned table (written by
``gdnjit tune``) takes precedence when it has an entry for the exact problem. Either way the spec's
``retile`` entries then see the call's own params (not the dispatch view) with the chosen tunables.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from . import expr as _expr
from .spec import Rule, Spec


class DispatchError(ValueError):
    """No rule of the spec gives valid tunables for these params (a spec bug: validation prevents it)."""


def select(
    spec: Spec,
    params: Mapping[str, Any],
    facts: Mapping[str, Any],
    tuned: Mapping[str, Any] | None = None,
    batch_invariant: bool = False,
) -> tuple[dict[str, Any], Rule | None]:
    """(tunables, the rule that chose them or None when they came from ``tuned``).

    The rules read the params as :meth:`Spec.dispatch_view` gives them and the facts as
    :meth:`Spec.dispatch_facts` does (``batch_invariant``: one batch value for all); the chosen tunables
    must be valid for the call's own params."""
    if tuned is not None and spec.valid(params, tuned):
        return retiled(spec, params, dict(tuned), spec.dispatch_facts(facts, batch_invariant)), None
    return select_each(spec, params, [facts], batch_invariant)[0]


def retiled(spec: Spec, params: Mapping[str, Any], tunables: dict[str, Any], facts: Mapping[str, Any],
            checks: Sequence[tuple[int, Any]] | None = None) -> dict[str, Any]:
    """``tunables`` as the first of the spec's ``retile`` entries whose ``when`` holds over the call's own params,
    these tunables and ``facts`` (as dispatch sees them), and whose changed tunables are valid, changes them.
    ``checks``: :func:`retile_checks` of these params, when the caller made them once for many calls."""
    hit = _retile_entry(spec, params, tunables, facts, checks) if spec.retile else None
    return tunables if hit is None else hit[1]


def retile_checks(spec: Spec, params: Mapping[str, Any]) -> list[tuple[int, Any]]:
    """(index, the rest of its ``when``) of each retile entry whose leading conjuncts that read only the call's
    params hold: they are the same for every tunables and facts of these params (a chain is evaluated left to
    right, so its leading part decides first), and most entries fail there (``varlen``, the state dtype)."""
    out = []
    for i, r in enumerate(spec.retile):
        parts = _expr.conjuncts(r.when)
        n = 0
        while n < len(parts) and _expr.names_in(parts[n]) <= params.keys():
            n += 1
        if all(_expr.evaluate(p, params) for p in parts[:n]):
            out.append((i, _expr.conjunction(parts[n:])))
    return out


def _retile_entry(spec: Spec, params: Mapping[str, Any], tunables: dict[str, Any], facts: Mapping[str, Any],
                  checks: Sequence[tuple[int, Any]] | None = None) -> tuple[int, dict[str, Any]] | None:
    """(index, changed tunables) of the retile entry that applies, or None."""
    checks = retile_checks(spec, params) if checks is None else checks
    if not checks:
        return None
    scope = _expr.scope(params)
    scope.update(tunables)
    scope.update(facts)
    for i, rest in checks:
        if rest(scope):
            changed = dict(tunables, **dict(spec.retile[i].use))
            if spec.valid(params, changed):
                return i, changed
    return None


def select_each(spec: Spec, params: Mapping[str, Any], facts_seq: Sequence[Mapping[str, Any]],
                batch_invariant: bool = False) -> list[tuple[dict[str, Any], Rule]]:
    """The rules' (tunables, rule) for each ``facts`` of ``facts_seq`` with the same params (one call's batch sizes
    and SM counts: what ``gdnjit warm`` plans; :func:`select` asks for one): each rule's conjuncts that read no fact
    are evaluated once for all of them, and its validity for the params checked once (a rule mostly fails on a
    param: T, the state dtype, the mode)."""
    view = spec.dispatch_view(params)
    fact_names = frozenset(spec.facts)
    holds: list = [_UNSEEN] * len(spec.rules)  # rule index -> its fact conjuncts' Conjunction, None: another fails

    def fact_parts(i: int, rule: Rule):  # evaluated on first need, in rule order
        parts = _expr.conjuncts(rule.when) if rule.when is not None else ()
        if any(_expr.names_in(p) & fact_names for p in parts[:-1]):
            rest, ok = parts, True  # a fact conjunct guards a later one: the whole chain per facts
        else:
            rest = tuple(p for p in parts if _expr.names_in(p) & fact_names)
            ok = all(_expr.evaluate(p, view) for p in parts if p not in rest)
        holds[i] = _expr.conjunction(rest) if ok and spec.valid(params, dict(rule.use)) else None
        return holds[i]

    checks = retile_checks(spec, params) if spec.retile else []
    out = []
    for facts in facts_seq:
        seen = spec.dispatch_facts(facts, batch_invariant)
        scope = _expr.scope(view)
        scope.update(seen)
        for i, rule in enumerate(spec.rules):
            test = holds[i]
            if test is _UNSEEN:
                test = fact_parts(i, rule)
            if test is not None and test(scope):
                out.append((retiled(spec, params, dict(rule.use), seen, checks), rule))
                break
        else:
            raise DispatchError(f"spec {spec.name}: no rule gives valid tunables for {dict(params)} with {dict(facts)}")
    return out


_UNSEEN = object()


def explain(spec: Spec, params: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """One line per rule saying whether it matched and why not: for ``gdnjit spec show``."""
    context = spec.dispatch_view(params)
    context.update(facts)
    lines, chosen = [], False
    for i, rule in enumerate(spec.rules):
        use = dict(rule.use)
        if rule.when is not None and not _expr.evaluate(rule.when, context):
            lines.append(f"rule {i}: when `{rule.when}` is false")
            continue
        bad = spec.violations(params, use)
        if bad:
            lines.append(f"rule {i}: {use} violates {'; '.join(bad)}")
            continue
        lines.append(f"rule {i}: {'CHOSEN' if not chosen else 'also valid'} {use} ({rule.why.strip()})")
        if not chosen:
            picked = use
        chosen = True
    if chosen and spec.retile:
        hit = _retile_entry(spec, params, picked, facts)
        context = {**params, **picked, **facts}
        for i, r in enumerate(spec.retile):
            state = (f"APPLIED: {hit[1]}" if hit is not None and hit[0] == i
                     else "holds, not applied" if _expr.evaluate(r.when, context) else "false")
            lines.append(f"retile {i}: when `{r.when}` {state}")
    return lines
