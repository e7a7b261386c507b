"""The dispatcher: pick a spec's tunables for one call from its ordered rules.

Rules are tried in order; the first whose ``when`` holds over the runtime facts and params and
whose tunables satisfy the spec's constraints for these params wins. A tuned table (written by
``gdnjit tune``) takes precedence when it has an entry for the exact problem.
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
        return dict(tuned), None
    context = spec.dispatch_view(params)
    context.update(spec.dispatch_facts(facts, batch_invariant))
    for rule in spec.rules:
        if rule.when is not None and not _expr.evaluate(rule.when, context):
            continue
        use = dict(rule.use)
        if spec.valid(params, use):
            return use, rule
    raise DispatchError(f"spec {spec.name}: no rule gives valid tunables for {dict(params)} with {dict(facts)}")


def select_each(spec: Spec, params: Mapping[str, Any], facts_seq: Sequence[Mapping[str, Any]],
                batch_invariant: bool = False) -> list[dict[str, Any]]:
    """``select(spec, params, facts)[0]`` for each ``facts`` of ``facts_seq`` (one call's batch sizes and SM
    counts: what ``gdnjit warm`` plans), with each rule's conjuncts that read no fact evaluated once for all of
    them, and each rule's validity for the params checked once (a rule mostly fails on a param: T, the state
    dtype, the mode)."""
    view = spec.dispatch_view(params)
    fact_names = frozenset(spec.facts)
    rules = []  # (rule, its conjuncts that read a fact) of the rules whose other conjuncts hold
    for rule in spec.rules:
        if rule.when is None:
            rules.append((rule, ()))
            continue
        parts = _expr.conjuncts(rule.when)
        if any(_expr.names_in(p) & fact_names for p in parts[:-1]):
            # a fact conjunct guards a later one (which might fail without the guard): the whole chain per call
            rules.append((rule, (rule.when,)))
            continue
        rest = tuple(p for p in parts if _expr.names_in(p) & fact_names)
        if all(_expr.evaluate(p, view) for p in parts if p not in rest):
            rules.append((rule, rest))
    valid: dict[int, bool] = {}
    out = []
    for facts in facts_seq:
        context = dict(view)
        context.update(spec.dispatch_facts(facts, batch_invariant))
        for i, (rule, rest) in enumerate(rules):
            if not all(_expr.evaluate(p, context) for p in rest):
                continue
            if i not in valid:
                valid[i] = spec.valid(params, dict(rule.use))
            if valid[i]:
                out.append(dict(rule.use))
                break
        else:
            raise DispatchError(f"spec {spec.name}: no rule gives valid tunables for {dict(params)} with {dict(facts)}")
    return out


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
        chosen = True
    return lines
