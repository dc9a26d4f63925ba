"""The built-in rewards: ``exact_match``, ``numeric``, ``arithmetic``, ``answer_only`` and ``math_verify``.

Each returns 1.0 for a correct completion and 0.0 otherwise, and accepts (and ignores) keyword
arguments it does not know, as every reward must. A completion without a usable answer scores 0.0;
a reference answer that cannot be read raises RewardError (that is a data problem, not a wrong
answer). Heavy dependencies (math-verify, sympy) are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

from areal_tasks.errors import ConfigError, RewardError
from areal_tasks.rollout.rewards.registry import register_reward

# A decimal number with optional thousands separators, exponent and "/denominator"; a sign only
# where it is not glued to a previous word or number (so "2024-01-02" ends with 2, not -2).
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
)
# Where a final answer is announced: "Answer: N" (the datasets' format) or GSM8K's "#### N".
_ANSWER_MARK = re.compile(r"Answer:|####")


def _last_number(text: str) -> float | None:
    """The first number after the last ``Answer:`` / ``####`` of ``text``, else its last number."""
    marks = list(_ANSWER_MARK.finditer(text))
    if marks:
        announced = _NUMBER.search(text, marks[-1].end())
        if announced is not None:
            return _value(announced)
    matches = list(_NUMBER.finditer(text))
    return _value(matches[-1]) if matches else None


def _value(match: re.Match[str]) -> float | None:
    value = float(match["num"].replace(",", ""))
    if match["den"] is not None:
        denominator = float(match["den"])
        if denominator == 0:
            return None
        value /= denominator
    return value


@register_reward("exact_match")
def exact_match(completion: str, answer: str, *, ignore_case: bool = False, **_: Any) -> float:
    """1.0 if the stripped completion equals the stripped answer (case-folded with ``ignore_case``)."""
    got, want = completion.strip(), answer.strip()
    if ignore_case:
        got, want = got.casefold(), want.casefold()
    return 1.0 if got == want else 0.0


@register_reward("numeric")
def numeric(completion: str, answer: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6, **_: Any) -> float:
    """1.0 if the completion's final number matches the reference number within the tolerances.

    The final number is the first one after the last ``Answer:`` (or ``####``), else the last
    number in the text; ``1,000``, ``-2.5e3`` and ``3/4`` are understood.
    """
    want = _last_number(answer)
    if want is None:
        raise RewardError(f"numeric reward: reference answer {answer!r} contains no number")
    got = _last_number(completion)
    if got is None or not math.isfinite(got):
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0


@register_reward("arithmetic")
def arithmetic(completion: str, answer: str, **_: Any) -> float:
    """The demo tasks' reward: exact integer match of the completion's final ``Answer: N``."""
    from areal_tasks.datasets.reward import arithmetic_reward

    try:
        return arithmetic_reward(completion, answer)
    except ConfigError as exc:
        raise RewardError(f"arithmetic reward: {exc}") from exc


@register_reward("answer_only")
def answer_only(completion: str, answer: str, **_: Any) -> float:
    """The demo tasks' format and nothing else: 1.0 if the completion (stripped) is exactly ``Answer: N``
    with ``N`` the reference integer. Unlike ``arithmetic`` (the last ``Answer:`` wins) text around the
    answer scores 0, so a policy cannot keep what it earns by running on past its answer."""
    from areal_tasks.datasets.answers import format_answer

    try:
        reference = int(str(answer).strip())
    except ValueError as exc:
        raise RewardError(f"answer_only reward: reference answer {answer!r} is not an integer") from exc
    return 1.0 if completion.strip() == format_answer(reference) else 0.0


@register_reward("math_verify")
def math_verify(completion: str, answer: str, **_: Any) -> float:
    """1.0 if math-verify finds the completion's answer equivalent to the reference (LaTeX-aware).

    Needs the ``math-verify`` package (in the ``train`` extra). math-verify's own timeouts use
    SIGALRM, so they are enabled only on the main thread (a worker process runs rewards there).
    """
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise RewardError(
            "the math_verify reward needs the math-verify package: pip install math-verify "
            f"(or pip install 'areal-tasks[train]'); import failed: {exc}"
        ) from exc
    on_main = threading.current_thread() is threading.main_thread()
    limit = 5 if on_main else None
    gold = parse(answer, parsing_timeout=limit) or parse(f"${answer}$", parsing_timeout=limit)
    if not gold:
        raise RewardError(f"math_verify reward: math-verify cannot parse the reference answer {answer!r}")
    target = parse(completion, parsing_timeout=limit)
    if not target:
        return 0.0
    return 1.0 if verify(gold, target, timeout_seconds=limit) else 0.0
