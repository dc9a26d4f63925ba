"""Verifiable rewards: exact integer match of the extracted final answer.

``arithmetic_reward(completion, answer)`` is 1.0 when ``extract_answer(completion)`` equals the
reference integer and 0.0 otherwise (including a missing or malformed answer). ``accuracy`` is the
mean reward over paired completions and references.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from areal_tasks.datasets.answers import extract_answer
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)


def arithmetic_reward(completion: str, answer: int | str) -> float:
    """1.0 if the completion's final ``Answer: N`` equals ``answer`` (an int or its decimal text), else 0.0."""
    try:
        reference = int(str(answer).strip())
    except ValueError as exc:
        raise ConfigError(f"reference answer {answer!r} is not an integer") from exc
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and predicted == reference else 0.0


def accuracy(completions: Sequence[str], answers: Sequence[int | str]) -> float:
    """Mean :func:`arithmetic_reward` over pairs; raises for unequal lengths or an empty input."""
    if len(completions) != len(answers):
        raise ConfigError(f"{len(completions)} completions but {len(answers)} reference answers")
    if not completions:
        raise ConfigError("accuracy of an empty set of completions is undefined")
    return sum(arithmetic_reward(c, a) for c, a in zip(completions, answers)) / len(completions)
