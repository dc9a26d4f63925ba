"""Answer extraction, the exact-match reward, and the partly-correct SFT demonstrations."""

from __future__ import annotations

import pytest

from areal_tasks.datasets import (
    Record,
    accuracy,
    arithmetic_reward,
    build_demonstrations,
    extract_answer,
    format_answer,
)
from areal_tasks.errors import ConfigError


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Answer: 71", 71),
        ("Answer:-3", -3),
        ("5 + 2 = 7. Answer: 7", 7),
        ("Answer: 4, no wait. Answer: 5", 5),
        ("the answer is 12", None),
        ("Answer: x", None),
        ("", None),
    ],
)
def test_extract_answer(completion: str, expected: int | None) -> None:
    assert extract_answer(completion) == expected


def test_reward_is_exact_integer_match() -> None:
    assert arithmetic_reward(format_answer(12), 12) == 1.0
    assert arithmetic_reward("Answer: 12", " 12 ") == 1.0
    assert arithmetic_reward("Answer: 13", "12") == 0.0
    assert arithmetic_reward("12", "12") == 0.0  # no answer in the required format
    assert accuracy(["Answer: 1", "Answer: 3", "nothing"], [1, 2, 3]) == pytest.approx(1 / 3)
    with pytest.raises(ConfigError):
        arithmetic_reward("Answer: 1", "one")
    with pytest.raises(ConfigError):
        accuracy(["Answer: 1"], [1, 2])


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_partly_correct_fraction(fraction: float) -> None:
    records = [Record(f"What is {i} + 0?", str(i)) for i in range(100)]
    demos = build_demonstrations(records, fraction, seed=7)
    wrong = [d for d in demos if not d.correct]
    assert len(wrong) == round(fraction * 100)
    for record, demo in zip(records, demos):
        assert demo.prompt == record.prompt
        assert (arithmetic_reward(demo.response, record.answer) == 1.0) == demo.correct
        assert extract_answer(demo.response) is not None
    assert build_demonstrations(records, fraction, seed=7) == demos
