"""Safe evaluation of the small expressions used in specs (constraints, rules, launch shapes).

Expressions are compiled with Jinja's immutable sandbox, or, for the common subset of Jinja and Python
(arithmetic, comparisons, boolean logic, conditionals, calls of the few globals: :func:`_fast`), by Python
from a whitelisted syntax tree evaluated without builtins; a name the expression uses but the context lacks
raises instead of silently becoming empty.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
import re
from typing import Any, Callable, Mapping

import sys

from .expr_common import GLOBALS, MAX_PLAIN_DEPTH, ExprError, wave_fill_pct  # noqa: F401 - expr's names

_FAST_GLOBALS = {"__builtins__": {}, **GLOBALS}
# Jinja's own default globals (jinja2.defaults.DEFAULT_NAMESPACE; a test keeps this list true): a text naming
# one is left to Jinja, and none is a free name
_JINJA_GLOBALS = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace"})


# The common subset that Python and Jinja parse and evaluate alike: names, numbers and strings, tuples and
# lists, arithmetic without **, comparisons (no `is`), and / or / not, x if c else y, calls of the globals
# with positional arguments. Such a text is compiled by Python (~30 us) instead of by Jinja's code generator
# (~1.5 ms, which a first dispatch paid ~60 times): the same value, the same errors (see _fast).
_FAST_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
    ast.Mod, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
    ast.GtE, ast.In, ast.NotIn, ast.IfExp, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Call,
)
_DECIMAL = re.compile(r"\d+(\.\d+)?([eE][+-]?\d+)?\Z")  # what Jinja's lexer reads as one number
# Jinja's literals and the names its templates define (a Python name elsewhere): left to Jinja
_JINJA_NAMES = {"true", "false", "none", "True", "False", "None", "self", "loop", "caller", "varargs", "kwargs"}


@functools.lru_cache(maxsize=4096)
def _fast(text: str):
    """(code object, free names) when ``text`` is in the common subset, else None (Jinja decides)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, _FAST_NODES):
            return None
        if isinstance(node, ast.Name):
            if node.id in _JINJA_NAMES or node.id in _JINJA_GLOBALS or node.id.startswith("_"):
                return None
            names.add(node.id)
        elif isinstance(node, ast.Constant):
            seg = ast.get_source_segment(text.strip(), node) or ""
            if isinstance(node.value, str):
                if seg[:1] not in ("'", '"'):  # r'', b'', u'': Jinja has no string prefixes
                    return None
            elif isinstance(node.value, bool) or not isinstance(node.value, (int, float)) or not _DECIMAL.match(seg) \
                    or node.value in (math.inf, -math.inf):
                return None  # True / None / 0x10 / 1_000 / 1j / 1e400 (Jinja writes it as `inf`): left to Jinja
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FAST_GLOBALS or node.keywords or \
                    any(isinstance(a, ast.Starred) for a in node.args):
                return None
    if sum(map(text.count, "([{")) > MAX_PLAIN_DEPTH:
        return None
    return compile(tree, "<gdnjit expression>", "eval"), frozenset(names - set(GLOBALS))


class _FastExpr:
    """A compiled common-subset expression, called like Jinja's: keyword values in, the value out; a free
    name the call lacks raises :class:`UndefinedName` with Jinja's message."""

    __slots__ = ("code", "names")

    def __init__(self, code, names):
        self.code, self.names = code, names

    def __call__(self, **values):
        scope = dict(_FAST_GLOBALS)
        scope.update(values)
        try:
            return eval(self.code, scope)  # noqa: S307 - a whitelisted AST (_FAST_NODES), no builtins
        except NameError as e:
            raise UndefinedName(f"{e.name!r} is undefined") from None


class UndefinedName(Exception):
    """A common-subset expression read a name its values lack (Jinja: ``UndefinedError``)."""


# text -> (free names, conjuncts, in the common subset): analyses recorded with the shipped specs (spec_record),
# so a serving process evaluates their expressions without parsing each one first (~80 in gdn.yaml)
_SEEDS: dict[str, tuple[frozenset, tuple, bool]] = {}


def analyse(text: str) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(sorted free names, :func:`conjuncts`, whether Python compiles it (:func:`_fast`)) of a valid
    expression: what :func:`seed` takes back. ExprError if :func:`compile_expr` would refuse it."""
    return tuple(sorted(check_expr(text))), conjuncts(text), _fast(text) is not None


def seed(analyses: Mapping[str, Any]) -> None:
    """Take expression analyses made by :func:`analyse` with this same code (the spec records are keyed by
    its digest), so :func:`check_expr`, :func:`conjuncts` and :func:`compile_expr` need not parse these texts."""
    for text, (names, parts, fast) in analyses.items():
        _SEEDS[text] = (frozenset(names), tuple(parts), bool(fast))


@functools.lru_cache(maxsize=4096)
def compile_expr(text: str) -> Callable[..., Any]:
    """Compile ``text`` once; returns a callable taking keyword values. Raises ExprError.

    Loading a spec only checks its expressions (:func:`check_expr`); each is compiled here when first
    evaluated. The common subset (:func:`_fast`) compiles with Python, the rest with Jinja's sandbox."""
    seeded = _SEEDS.get(text) if isinstance(text, str) else None
    if seeded is not None and seeded[2]:
        return _FastExpr(compile(text.strip(), "<gdnjit expression>", "eval"), seeded[0])
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected a non-empty expression string, got {text!r}")
    fast = _fast(text)
    if fast is not None:
        return _FastExpr(*fast)
    from .expr_jinja import compile_text

    return compile_text(text)


@functools.lru_cache(maxsize=4096)
def check_expr(text: str) -> frozenset[str]:
    """Refuse every text :func:`compile_expr` refuses, with the same error; return the free names (without
    builtins like ``min``). What passes here compiles later, at its first evaluation.

    Cheaply: the text is parsed as ``compile_expression`` parses it, and also compiled only where the parse
    cannot decide (:func:`_plain_names`: filters, tests, keyword arguments, foldable constants, deep nesting)."""
    seeded = _SEEDS.get(text) if isinstance(text, str) else None
    if seeded is not None:
        return seeded[0]
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected a non-empty expression string, got {text!r}")
    fast = _fast(text)
    if fast is not None:  # Jinja parses the common subset as Python does (no Jinja parse needed)
        return fast[1]
    from .expr_jinja import check_text

    return check_text(text, compile_expr)


def names_in(text: str) -> frozenset[str]:
    """The free variable names an expression refers to (without builtins like ``min``); ExprError if
    :func:`compile_expr` would refuse the text."""
    return check_expr(text)


def evaluate(text: str, context: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` over ``context``; raises ExprError naming the expression on failure.

    An expression is a pure function of its free names, so results are memoised on their values
    (``gdnjit warm`` plans thousands of dispatches whose rules mostly read a few params, and a
    Jinja call costs ~20 us). A chain ``a and b and c`` is evaluated one operand at a time, each
    memoised on its own names, with the same result (the first falsy operand, else the last): a rule's
    ``T == 2 and ... and B * HV < 1024`` then costs a memo hit for every B it rejects on T.
    Unhashable values are evaluated without the memo."""
    parts = conjuncts(text)
    if len(parts) == 1:
        return _evaluate_cached(text, context)
    for part in parts:
        result = _evaluate_cached(part, context)
        if not result:
            break
    return result


def scope(context: Mapping[str, Any]) -> dict[str, Any]:
    """``context`` over the callable globals, without builtins: what a :class:`Conjunction` reads (built once
    for the many conjunctions tried over one context)."""
    s = dict(_FAST_GLOBALS)
    s.update(context)
    return s


class Conjunction:
    """Whether every one of ``parts`` holds over a :func:`scope`, as ``all(evaluate(p, context) for p in parts)``
    decides it, evaluated as one compiled Python expression when every part is in the common subset
    (:func:`_fast`): no memo key per part (``gdnjit warm`` plans ~30,000 dispatches, each trying ~13 rules).
    A part that fails (a missing name, a bad operand) is evaluated again by :func:`evaluate`, which raises the
    ExprError naming it; a part outside the subset is always evaluated by :func:`evaluate`."""

    __slots__ = ("parts", "code")

    def __init__(self, parts: tuple[str, ...]):
        self.parts = tuple(parts)
        fast = all((_SEEDS[p][2] if p in _SEEDS else _fast(p) is not None) for p in self.parts)
        # each part on its own lines: a part's text cannot reach into the next one
        self.code = compile(" and ".join(f"(\n{p.strip()}\n)" for p in self.parts), "<gdnjit expression>", "eval") \
            if fast and self.parts else None

    def __call__(self, scope: dict[str, Any]) -> bool:
        if self.code is not None:
            try:
                return bool(eval(self.code, scope))  # noqa: S307 - whitelisted ASTs (_FAST_NODES), no builtins
            except (NameError, TypeError, ArithmeticError, ValueError):
                pass  # evaluate() below raises the error naming the part
        return all(evaluate(p, scope) for p in self.parts)


@functools.lru_cache(maxsize=4096)
def conjunction(parts: tuple[str, ...]) -> Conjunction:
    """The :class:`Conjunction` of ``parts``, made once."""
    return Conjunction(parts)


_KEYWORDS = ("and", "or", "if", "else")


@functools.lru_cache(maxsize=4096)
def conjuncts(text: str) -> tuple[str, ...]:
    """``text`` split at its top-level ``and`` keywords, or ``(text,)`` when a top-level ``or`` /
    ``if`` / ``else`` (lower precedence) could change the grouping or a piece does not compile alone
    (checked with :func:`check_expr`, which refuses exactly what compile_expr refuses)."""
    seeded = _SEEDS.get(text)
    if seeded is not None:
        return seeded[1]
    cuts, depth, quote, i = [], 0, None, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            word = next((k for k in _KEYWORDS if text.startswith(k, i)), None)
            end = i + len(word) if word else i
            if word and (end == len(text) or not (text[end].isalnum() or text[end] == "_")):
                if word != "and":
                    return (text,)
                cuts.append((i, end))
                i = end
                continue
        i += 1
    if not cuts:
        return (text,)
    bounds = [0] + [x for cut in cuts for x in cut] + [len(text)]
    parts = tuple(text[bounds[j]:bounds[j + 1]].strip() for j in range(0, len(bounds), 2))
    try:
        for part in parts:
            check_expr(part)
    except ExprError:
        return (text,)
    return parts


def _evaluate_cached(text: str, context: Mapping[str, Any]) -> Any:
    names = _sorted_names(text)
    # keyed with the types: 1, 1.0 and True hash alike but may evaluate differently
    values = tuple((type(v), v) for v in (context.get(n, _MISSING) for n in names))
    try:
        result = _evaluate_memo(text, names, values)
    except TypeError as e:  # an unhashable value: the memo cannot key it
        if "unhashable" not in str(e):
            raise
        return _evaluate(text, context)
    # the memo's copy of a mutable result must not be shared with (and changed by) a caller
    return copy.deepcopy(result) if isinstance(result, (list, dict, set)) else result


@functools.lru_cache(maxsize=4096)
def _sorted_names(text: str) -> tuple[str, ...]:
    return tuple(sorted(names_in(text)))


_MISSING = object()  # a free name the context lacks: evaluated (and reported) without it


@functools.lru_cache(maxsize=65536)
def _evaluate_memo(text: str, names: tuple[str, ...], values: tuple) -> Any:
    return _evaluate(text, {n: v for n, (_, v) in zip(names, values) if v is not _MISSING})


def _evaluate(text: str, context: Mapping[str, Any]) -> Any:
    fn = compile_expr(text)
    # jinja2's exceptions and Undefined only for an expression that took the Jinja path (its import is complete then:
    # another thread's import in progress leaves a partial module in sys.modules, without Undefined)
    jinja2 = None if isinstance(fn, _FastExpr) else sys.modules.get("jinja2")
    try:
        result = fn(**context)
    except UndefinedName as e:
        raise ExprError(f"expression {text!r}: {e}") from None
    except (TypeError, ArithmeticError, ValueError) as e:
        raise ExprError(f"expression {text!r}: {type(e).__name__}: {e}") from None
    except Exception as e:
        if jinja2 is not None and isinstance(e, jinja2.UndefinedError):
            raise ExprError(f"expression {text!r}: {e.message}") from None
        if jinja2 is not None and isinstance(e, jinja2.exceptions.SecurityError):
            raise ExprError(f"expression {text!r}: {type(e).__name__}: {e}") from None
        if jinja2 is not None and isinstance(e, NameError):  # a constant Jinja folded past the float range (1e308 *
            raise ExprError(f"expression {text!r}: {e} (a constant past the float range?)") from None  # 10) reads `inf`
        raise
    if jinja2 is not None and isinstance(result, jinja2.Undefined):
        raise ExprError(f"expression {text!r} evaluated to undefined")
    return result
