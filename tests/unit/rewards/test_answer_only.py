"""The ``answer_only`` reward: exactly ``Answer: N`` scores 1; the same answer with text around it, a
wrong or missing answer score 0; an unreadable reference is a RewardError."""

from __future__ import annotations

import pytest

from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards import resolve_reward
from areal_tasks.rollout.rewards.builtin import answer_only, arithmetic


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("Answer: 2", 1.0),
        ("  Answer: 2\n", 1.0),
        ("Answer: 3", 0.0),
        ("Answer: 2Answer", 0.0),  # running on past the answer (arithmetic scores it 1)
        ("I think Answer: 2", 0.0),
        ("Answer: 1Answer: 2", 0.0),
        ("2", 0.0),
        ("", 0.0),
    ],
)
def test_only_the_bare_answer_scores(completion: str, score: float) -> None:
    assert answer_only(completion, "2") == score
    assert answer_only(completion, " 2 ") == score


def test_it_is_registered_and_stricter_than_arithmetic() -> None:
    assert resolve_reward("answer_only") is answer_only
    assert arithmetic("Answer: 2Answer", "2") == 1.0 and answer_only("Answer: 2Answer", "2") == 0.0
    assert answer_only("Answer: -4", "-4") == 1.0


def test_an_unreadable_reference_is_a_reward_error() -> None:
    with pytest.raises(RewardError, match="answer_only reward: reference answer 'two' is not an integer"):
        answer_only("Answer: 2", "two")
