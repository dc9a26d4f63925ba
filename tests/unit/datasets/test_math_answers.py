r"""GSM8K and MATH answer extraction and comparison, as a table of cases (adversarial ones included:
no answer, several boxes, unbalanced braces, huge numbers, the unicode minus)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from areal_tasks.datasets.math_answers import (
    canonical_number,
    extract_boxed,
    extract_gsm8k_answer,
    extract_math_answer,
    math_equal,
    normalize_math_answer,
    parse_number,
)

GSM8K_CASES = [
    # (completion, expected final number)
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("so the total is 5 + 7 = 12\nAnswer: 12", "12"),
    ("Answer: $42.", "42"),
    ("The answer is \u22125.", "-5"),  # unicode minus
    ("The answer is: -3.25", "-3.25"),
    ("It costs $1,234,567.50 in total.", "1234567.5"),
    ("First 3 then 4 then 10.", "10"),  # no marker: the last number
    ("no numbers here at all", None),
    ("", None),
    ("x = 3.50 dollars", "3.5"),
    ("she paid -$3 net", "-3"),
    ("3-5 is not the point; 8", "8"),
    ("3-5", "5"),  # a hyphen between numbers is not a sign
    ("#### 7\nAnswer: 9", "7"),  # #### wins over Answer:
    ("Answer: 1\nlater reasoning\nAnswer: 2", "2"),  # the last Answer:
    ("Answer: unknown\n so 6", "6"),  # a marker without a number falls through
    ("we get \\boxed{18} apples, 3 baskets", "18"),
    ("the result is 123456789012345678901234567890", "123456789012345678901234567890"),  # huge
    ("total: 0.50", "0.5"),
    ("Answer: 3/4", "0.75"),  # a fraction after the marker is one value
    ("Answer: 1/3.", "1/3"),
    ("#### 3/4", "0.75"),  # after #### too
    ("48/2 = 24, 24/4 = 6\n#### 6", "6"),
    ("To answer this, we need 3 + 4 = 7", "7"),  # "answer" without a colon is not a marker
]


@pytest.mark.parametrize(("text", "expected"), GSM8K_CASES)
def test_gsm8k_extraction(text: str, expected: str | None) -> None:
    assert extract_gsm8k_answer(text) == expected


MATH_EXTRACT_CASES = [
    (r"So the answer is $\boxed{5}$.", "5"),
    (r"\boxed{\frac{a}{b+1}}", r"\frac{a}{b+1}"),  # nested braces
    (r"first \boxed{1} then \boxed{\sqrt{2}}", r"\sqrt{2}"),  # the last box wins
    (r"\fbox{7}", "7"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\boxed 7 is it", "7"),
    (r"earlier \boxed{3} and a broken \boxed{4", "3"),  # unbalanced braces: the earlier box
    ("Answer: $\\frac12$.", r"\frac12"),
    ("no answer given", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), MATH_EXTRACT_CASES)
def test_math_extraction(text: str, expected: str | None) -> None:
    assert extract_math_answer(text) == expected


EQUAL_CASES = [
    # (prediction, reference, equal?)
    (r"\frac{1}{2}", "1/2", True),
    (r"\dfrac{1}{2}", "0.5", True),
    (r"\frac12", ".5", True),
    (r"\tfrac{3}{4}", r"\frac{6}{8}", True),  # numerically equal fractions
    (r"-\frac{3}{4}", "-0.75", True),
    (r"\left( 1, 2 \right)", "(1,2)", True),
    (r"90^\circ", "90", True),
    (r"90^{\circ}", "90", True),
    (r"50\%", "50", True),
    (r"5\text{ cm}", "5", True),
    (r"\text{(A)}", "(A)", True),
    ("x = 3", "3", True),
    ("1,234", "1234", True),
    ("12.", "12", True),
    ("\u22127", "-7", True),  # unicode minus
    (r"\$18", "18", True),
    (r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}", True),
    (r"2 \sqrt{2}", r"2\sqrt{2}", True),
    ("123456789012345678901234567890", "123456789012345678901234567891", False),  # huge, exact
    ("1/3", "0.333", False),
    ("3", "-3", False),
    (r"\frac{1}{2}", r"\frac{1}{3}", False),
    ("(1,2)", "(2,1)", False),
    ("x+1", "x+2", False),
    (None, "5", False),
    ("5", None, False),
    ("1/0", "2", False),
]


@pytest.mark.parametrize(("pred", "ref", "equal"), EQUAL_CASES)
def test_math_equal(pred: str | None, ref: str | None, equal: bool) -> None:
    assert math_equal(pred, ref) is equal


def test_relative_tolerance_is_opt_in() -> None:
    assert not math_equal("0.3333", "1/3")
    assert math_equal("0.3333", "1/3", rel_tol=1e-3)
    assert not math_equal("0.33", "1/3", rel_tol=1e-3)


def test_gsm8k_reference_and_completion_agree_through_math_equal() -> None:
    reference = "He has 3 * 400 = 1,200 now.\n#### 1,200"
    completion = "So he has $1200.00 in total. Answer: 1200"
    assert math_equal(extract_gsm8k_answer(completion), extract_gsm8k_answer(reference))


def test_helpers() -> None:
    assert extract_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert extract_boxed("none") is None
    assert canonical_number(Fraction(2469, 2)) == "1234.5"
    assert canonical_number(Fraction(-1, 8)) == "-0.125"
    assert canonical_number(Fraction(1, 3)) == "1/3"
    assert parse_number(r"\frac{3}{-4}") == Fraction(-3, 4)
    assert parse_number("x+1") is None
    assert normalize_math_answer(r" \left[ 0, \infty \right) . ") == r"[0,\infty)"
