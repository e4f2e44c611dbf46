"""Built-in tools (kind ``tool``): callables a policy calls in a multi-turn episode.

``calculator`` evaluates arithmetic safely: the expression is parsed with :mod:`ast` and
only numbers, parentheses and the operators ``+ - * / // % **`` are evaluated (no names,
calls, attributes or ``eval``), with bounds that keep every result small enough to compute
at once. docs/agents.md, "Tools", is the guide to writing one.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

from rlzoo.api import hookimpl
RLZOO_API_VERSION = "2"

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 200
"""The longest expression the calculator reads (characters)."""
MAX_DIGITS = 1000
"""The most digits an integer result (or operand of ``**``) may have."""


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            size = math.log10(abs(left)) * abs(right) if left not in (0, 1, -1) else 0.0
            if size > MAX_DIGITS:
                raise ValueError(f"the result of {left} ** {right} would have more than {MAX_DIGITS} digits")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and result.bit_length() > MAX_DIGITS * 3.33:
            raise ValueError(f"the result has more than {MAX_DIGITS} digits")
        if isinstance(result, complex):
            raise ValueError("the result is a complex number")
        return result
    shown = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
    raise ValueError(f"{shown!r} is not arithmetic: use numbers, parentheses and + - * / // % **")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, parentheses and the operators + - * / // % **, e.g. "12*34".
    """
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot read {expression!r}: {exc.msg}") from None
    value = _evaluate(tree.body)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"the result is {value}")
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


@hookimpl
def rlzoo_register_tools(register) -> None:
    register("calculator", calculator, examples=[{"expression": "12*34"}, {"expression": "(7 - 2) / 4"}],
             description="safe arithmetic on numbers with + - * / // % ** (ast, no eval)")
