"""The calculator tool: right answers, error texts (never exceptions) and hostile inputs refused cheaply."""

from __future__ import annotations

import json
import time

import pytest

from areal_tasks.agent.tools.calculator import (
    CALCULATOR_TOOL,
    MAX_EXPRESSION_CHARS,
    calculate,
    call_calculator,
    evaluate,
)
from areal_tasks.errors import AgentError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("47 + 82", "129"),
        ("12 - 99", "-87"),
        ("-(3 + 4) * 2", "-14"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("+5", "5"),
        ("1.5 * 4", "6"),
        (" ((1)) ", "1"),
    ],
)
def test_arithmetic(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('echo hi')",
        "open('/etc/passwd').read()",
        "(1).__class__",
        "x + 1",
        "'a' * 3",
        "True + 1",
        "1j * 2",
        "[1, 2]",
        "1 if 1 else 2",
        "lambda: 1",
        "1 < 2",
        "1; 2",
        "",
        "1 +",
    ],
)
def test_anything_but_arithmetic_is_an_error_text(expression: str) -> None:
    assert calculate(expression).startswith("error: ")


@pytest.mark.parametrize(
    "expression",
    [
        "9 ** 9 ** 9",
        "10 ** 100",
        "2 ** 65",
        "2 ** 0.5",
        "99999999 * 99999999 * 99999999",
        "1e300 * 1e300",
        "1 / 0",
        "5 % 0",
        "0 ** -1",
    ],
)
def test_huge_or_undefined_results_are_refused_without_computing_them(expression: str) -> None:
    started = time.monotonic()
    assert calculate(expression).startswith("error: ")
    assert time.monotonic() - started < 5.0  # a deadline, not a timing assertion: 9**9**9 would take hours


def test_deep_nesting_and_long_expressions_are_refused() -> None:
    assert calculate("(" * 90 + "1" + ")" * 90) == "1"  # parentheses alone add no depth
    assert calculate("-(" * 50 + "1" + ")" * 50).startswith("error: ")  # within the length bound, too deep
    assert calculate("-" * 150 + "1").startswith("error: ")
    assert calculate("1+" * 5000 + "1").startswith("error: ")  # over the length bound, never parsed
    assert calculate("1" * (MAX_EXPRESSION_CHARS + 1)).startswith("error: ")
    with pytest.raises(AgentError, match="nested deeper"):
        evaluate("-(" * 40 + "1" + ")" * 40)


def test_call_calculator_takes_json_text_or_a_mapping_and_reports_bad_arguments() -> None:
    assert call_calculator('{"expression": "47 + 82"}') == "129"
    assert call_calculator({"expression": "3 * 4"}) == "12"
    for bad in ("not json", '{"expr": "1"}', '{"expression": 5}', "[1]", "null"):
        assert call_calculator(bad).startswith("error: ")
    assert calculate(None).startswith("error: ")  # type: ignore[arg-type]


def test_schema_is_an_openai_function_tool() -> None:
    function = CALCULATOR_TOOL["function"]
    assert CALCULATOR_TOOL["type"] == "function" and function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    json.dumps(CALCULATOR_TOOL)  # serialisable as the request's tools
