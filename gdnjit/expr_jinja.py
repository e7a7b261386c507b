"""The Jinja side of spec expressions (:mod:`gdnjit.expr`): the sandboxed environment, its compile and the
load-time check of texts outside the common Jinja/Python subset. Imported on first need: a process whose
expressions are all in the subset (every shipped spec's) never imports Jinja."""

from __future__ import annotations

import math

import jinja2
import jinja2.sandbox
from jinja2 import nodes
from jinja2.parser import Parser

from .expr_common import GLOBALS, MAX_PLAIN_DEPTH, ExprError

MAX_POWER_BITS = 4096  # an integer power past this many bits is an error, not minutes of arithmetic


class _Environment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The sandbox with ``**`` intercepted: Jinja never folds an intercepted operator while compiling (its optimizer
    computed ``1000 ** 10**25`` at load time, without end), and at run time a power is bounded."""

    intercepted_binops = frozenset({"**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and abs(left).bit_length() * right > MAX_POWER_BITS + 64:
            raise ExprError(f"{left!r} ** {right!r}: expected a power of at most {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


ENV = _Environment(undefined=jinja2.StrictUndefined)
ENV.globals.update(GLOBALS)


def compile_text(text: str):
    """Jinja's compiled expression (a callable taking keyword values); ExprError for a syntax error or a number
    literal past the float range."""
    _finite_literals(_parse(text), text)
    try:
        return ENV.compile_expression(text, undefined_to_none=False)
    except jinja2.TemplateSyntaxError as e:
        raise ExprError(f"syntax error in expression {text!r}: {e.message}") from None


def _parse(text: str) -> nodes.Expr:
    """The expression node of ``text`` as ``compile_expression`` parses it; ExprError for a syntax error."""
    try:
        parser = Parser(ENV, text, state="variable")
        node = parser.parse_expression()
        if not parser.stream.eos:
            raise jinja2.TemplateSyntaxError("chunk after expression", parser.stream.current.lineno, None, None)
    except jinja2.TemplateSyntaxError as e:
        raise ExprError(f"syntax error in expression {text!r}: {e.message}") from None
    return node


def _finite_literals(node: nodes.Node, text: str) -> None:
    """Refuse a number literal past the float range (1e400): Jinja's code generator writes it as the name ``inf``,
    which no context defines (a NameError at every evaluation)."""
    for c in (node, *node.find_all(nodes.Const)):
        if isinstance(c, nodes.Const) and isinstance(c.value, float) and not math.isfinite(c.value):
            raise ExprError(f"expression {text!r}: a number literal past the float range")


# Node types for which Jinja's code generator has no check of its own that can fail, when a call passes no
# keyword or * / ** arguments (a keyword named like a Python keyword, or repeated, fails in Python's
# compile). Filters and tests are not among them: an unknown one fails in the generator.
_PLAIN_NODES = (
    nodes.Name, nodes.Const, nodes.Tuple, nodes.List, nodes.CondExpr, nodes.Compare, nodes.Operand,
    nodes.BinExpr, nodes.UnaryExpr, nodes.Concat, nodes.Call, nodes.Getattr, nodes.Getitem, nodes.Slice,
)
# Name-free nodes that Jinja's constant folding turns into a value of the same size (or leaves alone). Other
# name-free parts are folded while compiling, which can fail: 10 ** 9999 (too many digits to write out),
# {[1]: 2} (TypeError); only small arithmetic (48 * 1024, -1) is let through (_small_arithmetic).
_LITERALS = (nodes.Const, nodes.Tuple, nodes.List, nodes.Slice)


class _NotPlain(Exception):
    pass


def _plain_names(node: nodes.Node, depth: int = 0) -> bool:
    """Whether ``node`` reads a name; raises _NotPlain unless compiling it cannot fail (see above)."""
    if depth > MAX_PLAIN_DEPTH or not isinstance(node, _PLAIN_NODES):
        raise _NotPlain
    if isinstance(node, nodes.Call) and (node.kwargs or node.dyn_args or node.dyn_kwargs):
        raise _NotPlain
    if isinstance(node, nodes.Name):
        return True
    reads = False
    for child in node.iter_child_nodes():
        reads = _plain_names(child, depth + 1) or reads
    if not reads and not isinstance(node, (_LITERALS, nodes.Operand)) and not _small_arithmetic(node):
        raise _NotPlain  # (an Operand, one comparison's right-hand side, is not folded alone)
    return reads


def _small_arithmetic(node: nodes.Node) -> bool:
    """``node`` is + - * / // % (not **) and unary signs over at most 8 numbers below 2**64: folded, an integer
    below 2**512 or a float (an error, e.g. division by zero, is not folded: Jinja compiles the operation)."""
    leaves = []

    def walk(n: nodes.Node) -> bool:
        if isinstance(n, nodes.Const):
            leaves.append(n.value)
            return isinstance(n.value, (int, float)) and abs(n.value) < 2 ** 64 and len(leaves) <= 8
        if isinstance(n, (nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod)):
            return walk(n.left) and walk(n.right)
        return isinstance(n, (nodes.Neg, nodes.Pos)) and walk(n.node)

    return walk(node)


def check_text(text: str, compile_expr) -> frozenset[str]:
    """expr.check_expr for a text outside the common subset: parse as Jinja does, compile where the parse cannot
    decide (``compile_expr``), return the free names."""
    node = _parse(text)
    _finite_literals(node, text)
    try:
        _plain_names(node)
        if sum(map(text.count, "([{")) > MAX_PLAIN_DEPTH:  # deep brackets: the compile's own parse may recurse
            raise _NotPlain                                 # too deep (parentheses make no nodes to count)
    except _NotPlain:
        compile_expr(text)
    # 'self' is the template reference, defined in every template (as in jinja2.meta.find_undeclared_variables)
    names = {n.name for n in (node, *node.find_all(nodes.Name)) if isinstance(n, nodes.Name) and n.ctx == "load"}
    return frozenset(names - {"self"} - set(ENV.globals))


