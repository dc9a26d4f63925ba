"""The answer format shared by the demo tasks: a completion ends with ``Answer: N`` (N an integer).

``format_answer(71)`` gives ``"Answer: 71"``; :func:`extract_answer` returns the integer of the last
``Answer:`` in a completion (so a model may reason before it), or None when there is none.
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

#: how a completion states its final answer (documented for prompts and docs).
ANSWER_FORMAT = "Answer: <integer>"

_ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def format_answer(value: int) -> str:
    """The canonical answer text of ``value``."""
    return f"Answer: {int(value)}"


def extract_answer(completion: str) -> int | None:
    """The integer after the last ``Answer:`` of ``completion``; None if there is no such answer."""
    matches = _ANSWER.findall(completion)
    if not matches:
        return None
    return int(matches[-1])
