r"""The math-benchmark rewards: ``gsm8k`` (a final number, exact) and ``math`` (MATH's ``\boxed{}``).

Both extract the answer with :mod:`areal_tasks.datasets.math_answers` and return 1.0 for a correct
completion, 0.0 otherwise; a completion without an answer scores 0.0, a reference without one
raises RewardError (a data problem, not a wrong answer). Extra keyword arguments (``tests=``,
``metadata=``, ...) are accepted and ignored, as every reward must.

``math`` first compares with :func:`~areal_tasks.datasets.math_answers.math_equal` (cheap, exact
on numbers and simple LaTeX); only when that says "different" does it ask math-verify (sympy) about
the two boxed strings, for answers such as ``(x+1)^2`` vs ``x^2+2x+1``. math-verify's time limits
use SIGALRM, which works only on the main thread: as for the ``math_verify`` reward they are set
there (a reward worker process runs rewards on its main thread) and left off elsewhere (a reward
run in-process, ``rollout.reward.workers: 0``, is then bounded only by the runner's timeout).

The module is not called ``math.py``: reward workers run ``_worker.py`` from this folder by path, so
a ``math.py`` here would shadow the standard library's ``math`` in them. The function registered as
``math`` is :func:`math_boxed` for the same reason (it would shadow the module in importers).
"""

from __future__ import annotations

import logging
import threading
from fractions import Fraction
from typing import Any

from areal_tasks.datasets.math_answers import extract_gsm8k_answer, extract_math_answer, math_equal, parse_number
from areal_tasks.errors import RewardError
from areal_tasks.rollout.rewards.registry import register_reward

logger = logging.getLogger(__name__)

#: seconds math-verify may spend parsing one string, and verifying one pair (main thread only).
MATH_VERIFY_TIMEOUT_S = 5


@register_reward("gsm8k")
def gsm8k(completion: str, answer: str, **_: Any) -> float:
    """1.0 if the completion's final number equals the reference's exactly (as rationals).

    The final number is the one after the last ``####``, else after ``Answer:`` / ``answer is``,
    else in the last ``\\boxed{}``, else the last number of the text
    (:func:`~areal_tasks.datasets.math_answers.extract_gsm8k_answer`). The reference may be a whole
    GSM8K solution (``... #### 72``) or a bare number; a text that is one number as a whole is
    that number. ``1,000``, ``$5`` and ``3/4`` are read as numbers, so ``0.75`` equals ``3/4`` and
    ``72.0`` equals ``72`` (no rounding: ``0.333`` is not ``1/3``).
    """
    want = _final_number(answer)
    if want is None:
        raise RewardError(f"gsm8k reward: reference answer {answer[-200:]!r} contains no number")
    got = _final_number(completion)
    return 1.0 if got is not None and got == want else 0.0


def _final_number(text: str) -> Fraction | None:
    """The text's value when all of it is one number (``1/2`` is one value, not 1 and 2), else
    the number :func:`extract_gsm8k_answer` finds; None when there is none."""
    whole = parse_number(text.strip().rstrip("."))
    if whole is not None:
        return whole
    found = extract_gsm8k_answer(text)
    return parse_number(found) if found is not None else None


@register_reward("math")
def math_boxed(completion: str, answer: str, **_: Any) -> float:
    """1.0 if the completion's last ``\\boxed{}`` states the reference answer (MATH style).

    The answer is the content of the last ``\\boxed{}`` / ``\\fbox{}``, else the rest of the last
    ``Answer:`` line (:func:`~areal_tasks.datasets.math_answers.extract_math_answer`); the reference
    may be a whole MATH solution (its last box is the answer) or the bare answer. Equal when
    :func:`~areal_tasks.datasets.math_answers.math_equal` says so, else when math-verify's
    ``verify`` finds the two parsed answers equivalent (see the module docstring for time limits).
    """
    want = extract_math_answer(answer) or answer.strip()
    if not want:
        raise RewardError(f"math reward: reference answer {answer[-200:]!r} is empty")
    got = extract_math_answer(completion)
    if got is None:
        return 0.0
    if math_equal(got, want):
        return 1.0
    return 1.0 if _math_verify_equal(got, want) else 0.0


def _math_verify_equal(got: str, want: str) -> bool:
    """math-verify's opinion on two boxed answers (False when either does not parse)."""
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise RewardError(
            "the math reward needs the math-verify package for answers that are not plain numbers: "
            f"pip install math-verify (or pip install 'areal-tasks[train]'); import failed: {exc}"
        ) from exc
    limit = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{want}}}", parsing_timeout=limit)
    if not gold:
        raise RewardError(f"math reward: math-verify cannot parse the reference answer {want!r}")
    target = parse(f"\\boxed{{{got}}}", parsing_timeout=limit)
    if not target:
        logger.debug("math reward: math-verify cannot parse the answer %r", got[:200])
        return False
    return bool(verify(gold, target, timeout_seconds=limit))
