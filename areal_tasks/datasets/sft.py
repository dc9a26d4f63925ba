"""SFT demonstrations that are only *partly* correct.

A warm start that copied perfect demonstrations would leave RL nothing to fix; here a fraction
``wrong_fraction`` of the demonstrations (chosen with ``random.Random(seed)``, exactly
``round(wrong_fraction * n)`` of them) states a wrong answer: the right one shifted by a non-zero
offset in ``-3..3``. The final response is the task's answer format alone (``Answer: N``), so the
model learns the format from every demonstration and the task from most of them.

Records that carry tools (the ``calculator`` task) get tool-using transcripts: the assistant calls
the calculator on the question's expression, the tool message holds the real result, and the
assistant answers. Their wrong demonstrations go wrong one of two ways, half each (seeded): the
assistant skips the tool and guesses (the right value off by 1-3), or calls it and then states its
result off by 1-3. The warm-started model thus calls the tool and copies the result only most of
the time, and RL gains by learning to always do both.

Records with images (the ``shapes`` task) keep them: their demonstration shows the images before the
prompt text (one ``{"type": "image"}`` part each, as the ``vision`` workflow renders the prompt), and
the SFT loop renders it through the model's processor.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from areal_tasks.datasets.answers import format_answer
from areal_tasks.datasets.calculator import expression_of, tool_call_turns
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

_WRONG_OFFSETS = (-3, -2, -1, 1, 2, 3)


@dataclass(frozen=True)
class Demonstration:
    """One SFT example: the prompt, the final assistant response and whether its answer is right.

    ``turns`` are the messages between the user's prompt and the final response (an assistant tool
    call and the tool's result); ``tools`` the tool schemas the transcript is rendered with;
    ``images`` the images the prompt shows (RGB Pillow images; empty for text).
    """

    prompt: str
    response: str
    correct: bool
    turns: tuple[Mapping[str, Any], ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    images: tuple[Any, ...] = ()

    def messages(self, system: str | None) -> list[dict[str, Any]]:
        """The whole chat: the system turn (when ``system`` is non-empty), the prompt (after an image
        part per image), turns, response."""
        head = [{"role": "system", "content": system}] if system else []
        tail = [{"role": "assistant", "content": self.response}]
        user: dict[str, Any] = {"role": "user", "content": self.prompt}
        if self.images:
            parts = [{"type": "image"} for _ in self.images]
            user = {"role": "user", "content": [*parts, {"type": "text", "text": self.prompt}]}
        return [*head, user, *(dict(t) for t in self.turns), *tail]


def _reference(i: int, record: Record) -> int:
    try:
        return int(str(record.answer).strip())
    except ValueError as exc:
        raise ConfigError(f"record {i}: answer {record.answer!r} is not an integer") from exc


def _tool_demonstration(record: Record, wrong: bool, rng: random.Random) -> Demonstration:
    call, result = tool_call_turns(expression_of(record.prompt))
    value = int(result["content"])
    skip_tool = wrong and rng.random() < 0.5
    if wrong:
        value += rng.choice(_WRONG_OFFSETS)
    turns = () if skip_tool else (call, result)
    return Demonstration(record.prompt, format_answer(value), not wrong, turns=turns, tools=record.tools)


def build_demonstrations(records: Sequence[Record], wrong_fraction: float, seed: int = 0) -> list[Demonstration]:
    """One demonstration per record, ``round(wrong_fraction * len(records))`` of them with a wrong answer."""
    if not 0.0 <= wrong_fraction <= 1.0:
        raise ConfigError(f"wrong_fraction={wrong_fraction!r} must be in [0, 1]")
    rng = random.Random(seed)
    n_wrong = round(wrong_fraction * len(records))
    wrong = set(rng.sample(range(len(records)), n_wrong))
    demos = []
    for i, record in enumerate(records):
        value = _reference(i, record)
        if record.tools:
            demos.append(_tool_demonstration(record, i in wrong, rng))
            continue
        if i in wrong:
            value += rng.choice(_WRONG_OFFSETS)
        demos.append(Demonstration(record.prompt, format_answer(value), i not in wrong, images=record.images))
    logger.debug("%d demonstrations, %d with a wrong answer", len(demos), n_wrong)
    return demos
