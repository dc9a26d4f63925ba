"""Which answer a completion gives, by reward: what ``answer_rate`` counts and ``maj@k`` votes on.

A reward judges a completion; the harness also needs the *answer* it states, to count how often a
model answers at all (``answer_rate``) and to vote among samples (``maj@k``). The extractor follows
the reward, so that the answer counted is the one the reward read:

=====================  ===================================================  =======================
reward                 extracted answer (None = no answer)                   vote key
=====================  ===================================================  =======================
``arithmetic``         the integer after the last ``Answer:``                the integer's text
``gsm8k``, ``numeric`` the final number (``####``, ``Answer:``, ``\\boxed``,  the canonical number
                       else the last number), canonical
``math``,              the last ``\\boxed{}``, else the ``Answer:`` line      ``normalize_math_answer``
``math_verify``
``code_tests``         the code of the last fenced block (None: no block)    the code, stripped
``exact_match``        the stripped completion (None when empty)             identity
anything else          the last non-empty line, stripped (None when empty)   identity
=====================  ===================================================  =======================

A reward given as an import path that points at a registered reward uses that reward's row.
Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from areal_tasks.datasets.answers import extract_answer
from areal_tasks.datasets.math_answers import extract_gsm8k_answer, extract_math_answer, normalize_math_answer

logger = logging.getLogger(__name__)

__all__ = ["FALLBACK", "AnswerExtractor", "extractor_for"]


@dataclass(frozen=True)
class AnswerExtractor:
    """``extract(completion) -> answer | None`` and the ``vote_key`` answers are compared by in maj@k."""

    name: str
    extract: Callable[[str], str | None]
    vote_key: Callable[[str], str] = str


def _arithmetic(text: str) -> str | None:
    value = extract_answer(text)
    return None if value is None else str(value)


def _code_block(text: str) -> str | None:
    from areal_tasks.rollout.rewards.sandbox import extract_code

    code = extract_code(text)
    if code == text:  # extract_code hands back the whole text when there is no fenced block
        return None
    return code.strip() or None


def _stripped(text: str) -> str | None:
    return text.strip() or None


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


_MATH = AnswerExtractor("math", extract_math_answer, normalize_math_answer)
_GSM8K = AnswerExtractor("gsm8k", extract_gsm8k_answer)

#: reward name -> extractor (names of rewards other helpers add, ``gsm8k`` and ``math``, included).
EXTRACTORS: dict[str, AnswerExtractor] = {
    "arithmetic": AnswerExtractor("arithmetic", _arithmetic),
    "gsm8k": _GSM8K,
    "numeric": _GSM8K,
    "math": _MATH,
    "math_verify": _MATH,
    "code_tests": AnswerExtractor("code_block", _code_block),
    "exact_match": AnswerExtractor("stripped_completion", _stripped),
}

#: the extractor of any other reward.
FALLBACK = AnswerExtractor("last_line", _last_line)


def extractor_for(reward: str) -> AnswerExtractor:
    """The extractor of ``reward`` (a registered name or an import path; see the module docstring)."""
    if reward in EXTRACTORS:
        return EXTRACTORS[reward]
    from areal_tasks.rollout.rewards import registered_name, resolve_reward

    name = registered_name(resolve_reward(reward))
    if name is not None and name in EXTRACTORS:
        return EXTRACTORS[name]
    logger.info("reward %r has no answer extractor of its own: answers are the last non-empty line", reward)
    return FALLBACK
