"""The dispatcher: pick a spec's tunables for one call from its ordered rules.

Rules are tried in order; the first whose ``when`` holds over the runtime facts and params and
whose tunables satisfy the spec's constraints for these params wins. A tuned table (written by
``gdnjit tune``) takes precedence when it has an entry for the exact problem.
"""

from __future__ import annotations

from typing import Any, Mapping

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
