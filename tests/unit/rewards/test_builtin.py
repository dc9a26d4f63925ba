"""The built-in rewards: exact_match, numeric, arithmetic and math_verify."""

from __future__ import annotations

import sys

import pytest

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards import arithmetic, exact_match, math_verify, numeric, resolve_reward


def test_exact_match_strips_and_optionally_folds_case() -> None:
    assert exact_match("  Paris\n", "Paris") == 1.0
    assert exact_match("paris", "Paris") == 0.0
    assert exact_match("PARIS", " paris ", ignore_case=True) == 1.0
    assert exact_match("Paris!", "Paris", ignore_case=True) == 0.0


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("so the result is 42.", "42", 1.0),
        ("Answer: 12 because 3*4=12 and 7", "12", 1.0),  # the announced answer, not the last number
        ("3 apples, 4 pears. Answer: -7", "-7", 1.0),
        ("It costs 1,000 dollars", "1000", 1.0),
        ("x = 0.3333333", "1/3", 1.0),
        ("ratio 3/4", "0.75", 1.0),
        ("about 2.5e3", "2500", 1.0),
        ("dated 2024-01-02, so 2", "#### 2", 1.0),
        ("3.14", "3.14159", 0.0),
        ("Answer: 41", "42", 0.0),
        ("no number here", "42", 0.0),
    ],
)
def test_numeric(completion: str, answer: str, expected: float) -> None:
    assert numeric(completion, answer) == expected


def test_numeric_tolerances_and_bad_reference() -> None:
    assert numeric("3.14", "3.14159", rel_tol=1e-3) == 1.0
    assert numeric("100.4", "100", abs_tol=0.5) == 1.0
    with pytest.raises(RewardError, match="contains no number"):
        numeric("1", "n/a")


def test_arithmetic_reuses_the_dataset_reward() -> None:
    assert arithmetic("7 + 5 = 12\nAnswer: 12", "12") == 1.0
    assert arithmetic("Answer: 13", "12") == 0.0
    assert arithmetic("no answer", "12") == 0.0
    with pytest.raises(RewardError, match="not an integer"):
        arithmetic("Answer: 1", "one")


def test_math_verify_equivalent_latex_and_decimals() -> None:
    pytest.importorskip("math_verify")
    assert math_verify("The answer is $0.5$", "\\frac{1}{2}") == 1.0
    assert math_verify("so \\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert math_verify("The answer is $\\boxed{3}$", "\\frac{1}{2}") == 0.0
    assert math_verify("I do not know", "\\frac{1}{2}") == 0.0
    with pytest.raises(RewardError, match="cannot parse the reference"):
        math_verify("$1$", "")


def test_math_verify_without_the_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(RewardError, match="pip install math-verify"):
        math_verify("1", "1")


def test_builtins_ignore_unknown_keywords_and_resolve_by_name() -> None:
    assert exact_match("a", "a", prompt="q?") == 1.0
    for name, fn in [("exact_match", exact_match), ("numeric", numeric), ("arithmetic", arithmetic)]:
        assert resolve_reward(name) is fn
    assert resolve_reward("math_verify") is math_verify
