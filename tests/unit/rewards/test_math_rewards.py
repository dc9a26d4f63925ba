r"""The math-benchmark rewards ``gsm8k`` and ``math`` on GSM8K- and MATH-shaped strings, adversarial
ones included (several boxes, no box, no ``####``, commas, fractions vs decimals, many numbers)."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from typing import Any

import pytest

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards import RewardRunner, gsm8k, math_boxed, math_rewards, resolve_reward

# GSM8K's own solution format: calculator annotations <<...>> and the final "#### N" line.
NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
WENG = (
    "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
    "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"
)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        # the model's own solution in the reference's format
        ("In May she sold 48 / 2 = 24 clips.\nIn total 48 + 24 = 72 clips.\n#### 72", NATALIA, 1.0),
        ("In May she sold 48 / 2 = 24 clips.\nIn total 48 + 24 = 71 clips.\n#### 71", NATALIA, 0.0),
        # no "####": the announced answer, else the last number
        ("She sold 24 clips in May, so 72 clips in total.", NATALIA, 1.0),
        ("She sold 72 clips in April and May, 24 of them in May.", NATALIA, 0.0),
        ("The answer is 72. Check: 72 - 24 = 48.", NATALIA, 1.0),  # the announced answer, not the last number
        ("Per minute: $0.2. For 50 minutes: $10.", WENG, 1.0),
        ("Per minute: $0.2. For 50 minutes: $10.50.", WENG, 0.0),
        # thousands commas, currency, a trailing period, decimals equal to integers
        ("The total cost is $1,200.", "#### 1200", 1.0),
        ("The total cost is $1,200.", "#### 120", 0.0),
        ("#### 72.00", "72", 1.0),
        ("#### 7.2", "72", 0.0),
        # fractions vs decimals: exact rationals
        ("Each gets 3/4 of a pizza.\n#### 3/4", "#### 0.75", 1.0),
        ("Answer: 1/3", "0.333", 0.0),  # no rounding: 1/3 is not 0.333
        ("#### 0.5", "1/2", 1.0),
        # the unicode minus of typeset text
        ("The temperature fell to \u22125 degrees.\n#### \u22125", "#### -5", 1.0),
        ("The temperature fell to \u22125 degrees.\n#### \u22125", "#### 5", 0.0),
        # a completion that prints many numbers: only the first after the last "####" counts
        ("#### 70 71 72 73", NATALIA, 0.0),
        ("Candidates: 70, 71, 72, 73", NATALIA, 0.0),
        ("#### 71\nOn second thought:\n#### 72", NATALIA, 1.0),
        # a boxed final answer (models trained on MATH do this)
        ("So she sold $\\boxed{72}$ clips.", NATALIA, 1.0),
        # no number at all
        ("I do not know.", NATALIA, 0.0),
        ("", "#### 3", 0.0),
    ],
)
def test_gsm8k(completion: str, answer: str, expected: float) -> None:
    assert gsm8k(completion, answer) == expected


def test_gsm8k_reference_without_a_number_is_a_data_error() -> None:
    with pytest.raises(RewardError, match="gsm8k reward: reference answer .* contains no number"):
        gsm8k("#### 3", "#### n/a")


# MATH's solution format: the answer in the last \boxed{}.
MATH_SOLUTION = "We have $f(2) = 3(2)^2 - 5 = 7$, so $f(f(2)) = f(7) = 3(7)^2 - 5 = \\boxed{142}$."
FRACTION_SOLUTION = "Multiplying, $\\frac{2}{3} \\cdot 7 = \\boxed{\\frac{14}{3}}$."


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("f(2) = 7 and f(7) = 142, so the answer is $\\boxed{142}$.", MATH_SOLUTION, 1.0),
        ("f(2) = 7 and f(7) = 142, so the answer is $\\boxed{143}$.", MATH_SOLUTION, 0.0),
        # several boxes: the last one is the answer
        ("First I got $\\boxed{7}$, but that is f(2); the answer is $\\boxed{142}$.", MATH_SOLUTION, 1.0),
        ("It is $\\boxed{142}$. Hmm, or maybe $\\boxed{7}$.", MATH_SOLUTION, 0.0),
        # no box: the announced answer, else nothing (a bare right number is not enough)
        ("The answer is 142.", MATH_SOLUTION, 1.0),
        ("I computed 142 in the end.", MATH_SOLUTION, 0.0),
        # LaTeX variants math_equal normalises: \dfrac, decimals for fractions, units, spaces
        ("$\\boxed{\\dfrac{14}{3}}$", FRACTION_SOLUTION, 1.0),
        ("$\\boxed{14/3}$", FRACTION_SOLUTION, 1.0),
        ("$\\boxed{\\frac{14}{3}}$", "\\frac{13}{3}", 0.0),
        ("$\\boxed{0.5}$", "\\frac12", 1.0),
        ("$\\boxed{0.51}$", "\\frac12", 0.0),
        ("$\\boxed{1,000}$", "1000", 1.0),
        ("$\\boxed{90^\\circ}$", "90", 1.0),
        ("$\\boxed{x = 5}$", "5", 1.0),
        # equivalences only math-verify sees
        ("$\\boxed{(x+1)^2}$", "x^2+2x+1", 1.0),
        ("$\\boxed{(x-1)^2}$", "x^2+2x+1", 0.0),
        ("$\\boxed{\\frac{1}{\\sqrt{2}}}$", "\\frac{\\sqrt{2}}{2}", 1.0),
        ("$\\boxed{\\frac{1}{\\sqrt{3}}}$", "\\frac{\\sqrt{2}}{2}", 0.0),
        ("$\\boxed{(-\\infty, 2]}$", "(-\\infty,2]", 1.0),
        ("$\\boxed{(-\\infty, 2)}$", "(-\\infty,2]", 0.0),
        # nested braces in the box, and an unclosed box after a good one
        ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt3}{2}", 1.0),
        ("$\\boxed{142}$ and then \\boxed{7", MATH_SOLUTION, 1.0),
        ("no answer at all", MATH_SOLUTION, 0.0),
    ],
)
def test_math(completion: str, answer: str, expected: float) -> None:
    assert math_boxed(completion, answer) == expected


def test_math_empty_reference_is_a_data_error() -> None:
    with pytest.raises(RewardError, match="math reward: reference answer .* is empty"):
        math_boxed("$\\boxed{1}$", "  ")


def test_math_needs_math_verify_only_beyond_math_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    assert math_boxed("$\\boxed{\\dfrac{14}{3}}$", FRACTION_SOLUTION) == 1.0  # math_equal decides
    with pytest.raises(RewardError, match="pip install math-verify"):
        math_boxed("$\\boxed{(x+1)^2}$", "x^2+2x+1")


def _fake_math_verify(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    fake = types.ModuleType("math_verify")

    def parse(text: str, parsing_timeout: int | None = 5) -> list[str]:
        seen.append(("parse", parsing_timeout))
        return [text]

    def verify(gold: Any, target: Any, timeout_seconds: int | None = 5) -> bool:
        seen.append(("verify", timeout_seconds))
        return True

    fake.parse, fake.verify = parse, verify  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "math_verify", fake)


def test_math_verify_time_limits_on_the_main_thread_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's limits use SIGALRM: set on the main thread, left off in other threads."""
    on_main: list[Any] = []
    _fake_math_verify(monkeypatch, on_main)
    assert math_boxed("$\\boxed{a}$", "b") == 1.0
    limit = math_rewards.MATH_VERIFY_TIMEOUT_S
    assert on_main == [("parse", limit), ("parse", limit), ("verify", limit)]

    in_thread: list[Any] = []
    _fake_math_verify(monkeypatch, in_thread)
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(math_boxed("$\\boxed{a}$", "b")))
    worker.start()
    worker.join()
    assert results == [1.0] and in_thread == [("parse", None), ("parse", None), ("verify", None)]


def test_registered_ignore_extra_keywords_and_run_in_workers() -> None:
    assert resolve_reward("gsm8k") is gsm8k and resolve_reward("math") is math_boxed
    assert gsm8k("#### 72", NATALIA, tests="assert True", metadata={"id": 1}) == 1.0
    assert math_boxed("$\\boxed{142}$", MATH_SOLUTION, tests=None, metadata={}) == 1.0

    async def scenario(gsm: RewardRunner, boxed: RewardRunner) -> list[float]:
        return await asyncio.gather(
            gsm.score("#### 72", NATALIA), gsm.score("#### 7", NATALIA), boxed.score("$\\boxed{(x+1)^2}$", "x^2+2x+1")
        )

    with RewardRunner("gsm8k", timeout_s=30) as gsm, RewardRunner("math", timeout_s=30) as boxed:
        assert asyncio.run(scenario(gsm, boxed)) == [1.0, 0.0, 1.0]
        assert gsm.stats()["failures"] == 0 and boxed.stats()["failures"] == 0
