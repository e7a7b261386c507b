"""Safe evaluation of the small expressions used in specs (constraints, rules, launch shapes).

Expressions are compiled with Jinja's immutable sandbox (never Python ``eval``); a name the
expression uses but the context lacks raises instead of silently becoming empty.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jinja2
import jinja2.meta
import jinja2.sandbox

_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined)
_ENV.globals.update(min=min, max=max, abs=abs, int=int, len=len)


class ExprError(ValueError):
    """An expression failed to parse or to evaluate."""


@functools.lru_cache(maxsize=4096)
def compile_expr(text: str) -> Callable[..., Any]:
    """Compile ``text`` once; returns a callable taking keyword values. Raises ExprError."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected a non-empty expression string, got {text!r}")
    try:
        return _ENV.compile_expression(text, undefined_to_none=False)
    except jinja2.TemplateSyntaxError as e:
        raise ExprError(f"syntax error in expression {text!r}: {e.message}") from None


@functools.lru_cache(maxsize=4096)
def names_in(text: str) -> frozenset[str]:
    """The free variable names an expression refers to (without builtins like ``min``)."""
    try:
        ast = _ENV.parse("{{ " + text + " }}")
    except jinja2.TemplateSyntaxError as e:
        raise ExprError(f"syntax error in expression {text!r}: {e.message}") from None
    return frozenset(jinja2.meta.find_undeclared_variables(ast)) - set(_ENV.globals)


def evaluate(text: str, context: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` over ``context``; raises ExprError naming the expression on failure."""
    fn = compile_expr(text)
    try:
        result = fn(**context)
    except jinja2.UndefinedError as e:
        raise ExprError(f"expression {text!r}: {e.message}") from None
    except (TypeError, ArithmeticError, ValueError, jinja2.exceptions.SecurityError) as e:
        raise ExprError(f"expression {text!r}: {type(e).__name__}: {e}") from None
    if isinstance(result, jinja2.Undefined):
        raise ExprError(f"expression {text!r} evaluated to undefined")
    return result
