"""A safe arithmetic calculator tool: an ``ast`` walk over numbers and arithmetic, never ``eval``.

Accepted: int and float literals, ``+ - * / // % **``, unary ``+``/``-`` and parentheses. Refused
with an error text: anything else (names, calls, attributes, strings, booleans, comparisons), an
expression longer than :data:`MAX_EXPRESSION_CHARS` or nested deeper than :data:`MAX_DEPTH`, an
exponent beyond :data:`MAX_EXPONENT` or a power whose result would pass :data:`MAX_MAGNITUDE`, any
intermediate result beyond :data:`MAX_MAGNITUDE`, and division by zero. Sizes are checked *before*
a power is computed, so ``9**9**9`` costs nothing.

:func:`calculate` returns the result as text (``"129"``, ``"2.5"``) or ``"error: ..."``;
:func:`call_calculator` takes a tool call's ``arguments`` (the JSON text the model produced, or a
dict) and does the same. :data:`CALCULATOR_TOOL` is the tool's schema in OpenAI's ``tools`` shape,
key for key what the official ``openai`` SDK and ``openai-agents`` (a ``FunctionTool`` with this
schema, ``strict_json_schema=False``) send, so a model warm-started on it sees the same text.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

MAX_EXPRESSION_CHARS = 200
MAX_DEPTH = 32
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**15

TOOL_NAME = "calculator"
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47 + 82"}},
            "required": ["expression"],
        },
        # what openai-agents' FunctionTool sends too: the same text whichever SDK offers the tool
        "strict": False,
    },
}

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _bounded(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise AgentError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise AgentError(f"a result exceeds {MAX_MAGNITUDE:.0e} in magnitude")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if not isinstance(exponent, int) or abs(exponent) > MAX_EXPONENT:
        raise AgentError(f"exponents must be integers in -{MAX_EXPONENT}..{MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise AgentError("division by zero")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise AgentError(f"a result exceeds {MAX_MAGNITUDE:.0e} in magnitude")
    return base**exponent


def _evaluate(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise AgentError(f"the expression is nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Pow)):
        left, right = _evaluate(node.left, depth + 1), _evaluate(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise AgentError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise AgentError(f"unsupported syntax: {type(node).__name__}; use numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> Number:
    """The value of ``expression``; raises AgentError for anything :func:`calculate` reports as an error."""
    if not isinstance(expression, str):
        raise AgentError(f"the expression must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise AgentError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise AgentError(f"not an arithmetic expression ({type(exc).__name__})") from exc
    try:
        return _evaluate(tree.body, 0)
    except (ArithmeticError, RecursionError) as exc:
        raise AgentError(f"cannot evaluate ({exc})") from exc


def format_number(value: Number) -> str:
    """``129`` -> ``"129"``; whole floats lose their ``.0``; other floats keep up to 12 significant digits."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> str:
    """The tool: the value of ``expression`` as text, or ``"error: <why>"``."""
    try:
        return format_number(evaluate(expression))
    except AgentError as exc:
        logger.debug("calculator refused %r: %s", expression, exc)
        return f"error: {exc}"


def call_calculator(arguments: str | Mapping[str, Any]) -> str:
    """Run a tool call's ``arguments`` (JSON text or a mapping with ``expression``); errors as text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return 'error: the arguments are not JSON; send {"expression": "..."}'
    if not isinstance(arguments, Mapping) or not isinstance(arguments.get("expression"), str):
        return 'error: send {"expression": "<arithmetic>"}'
    return calculate(arguments["expression"])
