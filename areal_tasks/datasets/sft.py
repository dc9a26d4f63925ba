"""SFT demonstrations that are only *partly* correct.

A warm start that copied perfect demonstrations would leave RL nothing to fix; here a fraction
``wrong_fraction`` of the demonstrations (chosen with ``random.Random(seed)``, exactly
``round(wrong_fraction * n)`` of them) states a wrong answer: the right one shifted by a non-zero
offset in ``-3..3``. The response text is the task's answer format alone (``Answer: N``), so the
model learns the format from every demonstration and the arithmetic from most of them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from areal_tasks.datasets.answers import format_answer
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

_WRONG_OFFSETS = (-3, -2, -1, 1, 2, 3)


@dataclass(frozen=True)
class Demonstration:
    """One SFT example: the prompt, the assistant response and whether its answer is right."""

    prompt: str
    response: str
    correct: bool


def build_demonstrations(records: Sequence[Record], wrong_fraction: float, seed: int = 0) -> list[Demonstration]:
    """One demonstration per record, ``round(wrong_fraction * len(records))`` of them with a wrong answer."""
    if not 0.0 <= wrong_fraction <= 1.0:
        raise ConfigError(f"wrong_fraction={wrong_fraction!r} must be in [0, 1]")
    rng = random.Random(seed)
    n_wrong = round(wrong_fraction * len(records))
    wrong = set(rng.sample(range(len(records)), n_wrong))
    demos = []
    for i, record in enumerate(records):
        try:
            value = int(str(record.answer).strip())
        except ValueError as exc:
            raise ConfigError(f"record {i}: answer {record.answer!r} is not an integer") from exc
        if i in wrong:
            value += rng.choice(_WRONG_OFFSETS)
        demos.append(Demonstration(record.prompt, format_answer(value), i not in wrong))
    logger.debug("%d demonstrations, %d with a wrong answer", len(demos), n_wrong)
    return demos
