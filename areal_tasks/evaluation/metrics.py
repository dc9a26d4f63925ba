"""Metrics over sampled answers: pass@1, unbiased pass@k, maj@k, answer rate and response length.

An evaluation draws ``n`` samples per item; each sample carries whether it was judged correct and
the answer extracted from it (None when extraction failed). :func:`compute_metrics` turns a list of
:class:`ItemResult` into one summary dict plus one JSON-ready record per item.

- ``pass@1``: the mean over items of the fraction of correct samples.
- ``pass@k``: the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` per item,
  computed as the product ``prod_{i=n-c+1}^{n} (1 - k/i)`` so no binomial coefficient is formed;
  it needs ``k <= n`` for every item.
- ``maj@k``: a majority vote over the extracted answers of the first ``k`` samples (answers that
  failed extraction do not vote; ties go to the answer seen first); the item counts as correct when
  the sample that first gave the voted answer was correct. Answers vote by exact string equality
  after ``vote_key`` (identity by default; pass a normaliser so ``1/2`` and ``\\frac{1}{2}`` agree).
- ``answer_rate``: the fraction of all samples with an extracted answer.
- ``mean_response_length``: in tokens when every sample gives ``n_tokens``, else in characters of
  its text (mixing the two is refused).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_tasks.errors import EvaluationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleResult:
    """One sampled response to an item.

    ``answer`` is the extracted answer (None when nothing could be extracted); ``correct`` the
    grader's verdict; ``n_tokens`` the response length in tokens when known.
    """

    correct: bool
    answer: str | None = None
    text: str = ""
    n_tokens: int | None = None


@dataclass(frozen=True)
class ItemResult:
    """All samples drawn for one item (``item_id`` names it in records and error messages)."""

    item_id: str
    samples: Sequence[SampleResult]
    reference: str | None = None


@dataclass(frozen=True)
class EvalReport:
    """The summary dict (keys ``pass@1``, ``pass@K``, ``maj@K``, ``answer_rate``,
    ``mean_response_length``, ``n_items``, ``n_samples``), one record per item, and the unit of
    ``mean_response_length`` (``"tokens"`` or ``"chars"``)."""

    summary: dict[str, float | int]
    items: list[dict[str, Any]] = field(default_factory=list)
    length_unit: str = "chars"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` correct out of ``n`` samples: ``1 - C(n-c, k)/C(n, k)``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, stable for large ``n``.
    """
    if n < 1:
        raise EvaluationError(f"pass@k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise EvaluationError(f"pass@k: correct count c={c} is outside 0..n={n}")
    if not 1 <= k <= n:
        raise EvaluationError(f"pass@k: k={k} must be between 1 and the number of samples n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_vote(samples: Sequence[SampleResult], vote_key: Callable[[str], str] = str) -> tuple[str | None, bool]:
    """The voted answer of ``samples`` (None when none has an answer) and whether it is correct.

    Ties go to the answer whose first occurrence is earliest; correctness is that of the first
    sample giving the voted answer.
    """
    counts: dict[str, int] = {}
    first: dict[str, SampleResult] = {}
    for sample in samples:
        if sample.answer is None:
            continue
        key = vote_key(sample.answer)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, sample)
    if not counts:
        return None, False
    # dicts keep insertion order, and max() returns the first maximal key: ties go to first seen.
    winner = max(counts, key=lambda key: counts[key])
    return winner, first[winner].correct


def compute_metrics(items: Sequence[ItemResult], k: int, *, vote_key: Callable[[str], str] = str) -> EvalReport:
    """Score ``items`` at ``k``: see the module docstring for each metric."""
    if not items:
        raise EvaluationError("no items to evaluate")
    if k < 1:
        raise EvaluationError(f"k must be at least 1, got k={k}")
    for item in items:
        if not item.samples:
            raise EvaluationError(f"item {item.item_id!r} has no samples")
        if k > len(item.samples):
            raise EvaluationError(
                f"item {item.item_id!r} has {len(item.samples)} samples, fewer than k={k}; "
                f"draw at least k samples per item or lower k"
            )
    all_samples = [s for item in items for s in item.samples]
    with_tokens = sum(s.n_tokens is not None for s in all_samples)
    if 0 < with_tokens < len(all_samples):
        raise EvaluationError(
            f"{with_tokens} of {len(all_samples)} samples give n_tokens: give it for all samples or for none"
        )
    length_unit = "tokens" if with_tokens else "chars"

    records: list[dict[str, Any]] = []
    sum_p1 = sum_pk = sum_maj = 0.0
    for item in items:
        n = len(item.samples)
        c = sum(bool(s.correct) for s in item.samples)
        p1 = c / n
        pk = pass_at_k(n, c, k)
        voted, maj_ok = majority_vote(item.samples[:k], vote_key)
        sum_p1 += p1
        sum_pk += pk
        sum_maj += float(maj_ok)
        records.append(
            {
                "item_id": item.item_id,
                "reference": item.reference,
                "n": n,
                "c": c,
                "pass@1": p1,
                f"pass@{k}": pk,
                f"maj@{k}": int(maj_ok),
                "voted_answer": voted,
                "answers": [s.answer for s in item.samples],
                "correct": [bool(s.correct) for s in item.samples],
            }
        )
    lengths = [(s.n_tokens if s.n_tokens is not None else len(s.text)) for s in all_samples]
    n_items = len(items)
    summary: dict[str, float | int] = {
        "pass@1": sum_p1 / n_items,
        f"pass@{k}": sum_pk / n_items,
        f"maj@{k}": sum_maj / n_items,
        "answer_rate": sum(s.answer is not None for s in all_samples) / len(all_samples),
        "mean_response_length": sum(lengths) / len(lengths),
        "n_items": n_items,
        "n_samples": len(all_samples),
    }
    logger.debug("evaluated %d items, %d samples at k=%d", n_items, len(all_samples), k)
    return EvalReport(summary=summary, items=records, length_unit=length_unit)
