"""The evaluation metrics equal a hand computation on a fixture whose answers are known, the pass@k
estimator agrees with brute-force enumeration of k-subsets, and bad inputs fail naming the item."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import pytest

from areal_tasks.errors import EvaluationError
from areal_tasks.evaluation import ItemResult, SampleResult, compute_metrics, pass_at_k


def _item(item_id: str, correct: list[bool], answers: list[str | None], texts: list[str] | None = None) -> ItemResult:
    texts = texts or ["x" * 10] * len(correct)
    return ItemResult(
        item_id=item_id,
        samples=[SampleResult(correct=c, answer=a, text=t) for c, a, t in zip(correct, answers, texts, strict=True)],
    )


def _fixture() -> list[ItemResult]:
    """3 items x 4 samples.

    a: correct T F T F, answers 5 3 5 3  -> c=2; maj@4 ties 2-2, "5" seen first and correct -> 1
    b: correct F F F T, answers 7 - 7 9  -> c=1; maj@4 "7" (2 votes) wrong -> 0; one failed extraction
    c: correct F F F F, no answers       -> c=0; no votes -> 0
    """
    return [
        _item("a", [True, False, True, False], ["5", "3", "5", "3"], ["abcd", "ab", "abcdef", "abcdefgh"]),
        _item("b", [False, False, False, True], ["7", None, "7", "9"], ["a", "ab", "abc", "abcd"]),
        _item("c", [False] * 4, [None] * 4, ["", "", "", ""]),
    ]


def test_summary_equals_a_hand_computation() -> None:
    report = compute_metrics(_fixture(), k=2)
    s = report.summary
    # pass@1: mean of c/n = (2/4 + 1/4 + 0/4) / 3
    assert s["pass@1"] == pytest.approx(0.25)
    # pass@2 by hand from combinations: C(4,2)=6 pairs per item.
    #   a: pairs with no correct sample = C(2,2)=1 -> 1 - 1/6 = 5/6
    #   b: pairs with no correct sample = C(3,2)=3 -> 1 - 3/6 = 1/2
    #   c: 0
    assert s["pass@2"] == pytest.approx((5 / 6 + 1 / 2 + 0) / 3)
    assert s["pass@2"] == pytest.approx(4 / 9)
    # maj@2 over the first two samples: a: "5" vs "3" tie -> "5" (first) correct; b: "7" wrong; c: none
    assert s["maj@2"] == pytest.approx(1 / 3)
    # answer_rate: 4 + 3 + 0 extracted answers of 12 samples
    assert s["answer_rate"] == pytest.approx(7 / 12)
    # lengths in characters: a 4+2+6+8=20, b 1+2+3+4=10, c 0
    assert s["mean_response_length"] == pytest.approx(30 / 12)
    assert report.length_unit == "chars"
    assert s["n_items"] == 3 and s["n_samples"] == 12
    assert set(s) == {"pass@1", "pass@2", "maj@2", "answer_rate", "mean_response_length", "n_items", "n_samples"}


def test_maj_at_4_with_a_tie_broken_by_first_occurrence() -> None:
    report = compute_metrics(_fixture(), k=4)
    assert report.summary["maj@4"] == pytest.approx(1 / 3)  # only item a (tie 5/3 -> "5", correct)
    assert [r["voted_answer"] for r in report.items] == ["5", "7", None]
    # the same tie with the wrong answer first: "3" is voted and the item is wrong
    flipped = compute_metrics([_item("d", [False, True, True, False], ["3", "5", "5", "3"])], k=4)
    assert flipped.summary["maj@4"] == 0.0
    assert flipped.items[0]["voted_answer"] == "3"
    # k=4 == n: pass@4 is 1 whenever any sample is correct
    assert report.summary["pass@4"] == pytest.approx((1 + 1 + 0) / 3)


def test_failed_extractions_do_not_vote() -> None:
    # two failed extractions would outvote the single answer if None voted
    report = compute_metrics([_item("e", [False, False, True], [None, None, "4"])], k=3)
    assert report.items[0]["voted_answer"] == "4"
    assert report.summary["maj@3"] == 1.0


def test_vote_key_merges_equivalent_answers() -> None:
    item = _item("f", [True, True, False], ["1/2", "0.5", "3"])
    assert compute_metrics([item], k=3).summary["maj@3"] == 1.0  # tie of three: "1/2" first
    item = _item("g", [False, True, True], ["3", "1/2", "0.5"])
    assert compute_metrics([item], k=3).summary["maj@3"] == 0.0  # "3" wins the three-way tie
    merged = compute_metrics([item], k=3, vote_key=lambda a: str(Fraction(a)))
    assert merged.summary["maj@3"] == 1.0
    assert merged.items[0]["voted_answer"] == "1/2"


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_pass_at_k_matches_enumeration_and_the_binomial_formula(n: int) -> None:
    for c in range(n + 1):
        correct = [i < c for i in range(n)]
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(correct[i] for i in sub) for sub in subsets) / len(subsets)
            formula = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(formula, abs=1e-12)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(10, 0, 3) == 0.0  # c = 0
    assert pass_at_k(10, 10, 3) == 1.0  # c = n
    assert pass_at_k(10, 1, 10) == 1.0  # k = n with one correct
    assert pass_at_k(10, 0, 10) == 0.0  # k = n with none correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c/n
    # large n stays finite and accurate (no huge binomials)
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)
    assert 0.0 < pass_at_k(100_000, 5, 100) < 1.0


def test_token_lengths_are_used_when_every_sample_gives_them() -> None:
    items = [
        ItemResult("t", [SampleResult(True, "1", "abc", n_tokens=10), SampleResult(False, "2", "abcdef", n_tokens=20)])
    ]
    report = compute_metrics(items, k=1)
    assert report.summary["mean_response_length"] == 15
    assert report.length_unit == "tokens"


def test_per_item_records_are_json_lines() -> None:
    report = compute_metrics(_fixture(), k=2)
    lines = [json.dumps(r) for r in report.items]
    first = json.loads(lines[0])
    assert first["item_id"] == "a" and first["n"] == 4 and first["c"] == 2
    assert first["pass@2"] == pytest.approx(5 / 6) and first["maj@2"] == 1
    assert first["answers"] == ["5", "3", "5", "3"]
    assert first["correct"] == [True, False, True, False]


def test_k_larger_than_an_items_samples_names_the_item() -> None:
    items = [*_fixture(), _item("short-one", [True, False], ["1", "2"])]
    with pytest.raises(EvaluationError, match=r"item 'short-one' has 2 samples, fewer than k=3"):
        compute_metrics(items, k=3)


@pytest.mark.parametrize(
    ("items", "k", "match"),
    [
        ([], 1, "no items"),
        ([ItemResult("empty", [])], 1, "item 'empty' has no samples"),
        ([_item("a", [True], ["1"])], 0, "k must be at least 1"),
        (
            [ItemResult("m", [SampleResult(True, "1", n_tokens=3), SampleResult(True, "1")])],
            1,
            "1 of 2 samples give n_tokens",
        ),
    ],
)
def test_bad_inputs_are_refused(items: list[ItemResult], k: int, match: str) -> None:
    with pytest.raises(EvaluationError, match=match):
        compute_metrics(items, k=k)


def test_pass_at_k_argument_errors() -> None:
    with pytest.raises(EvaluationError, match="k=5 must be between 1"):
        pass_at_k(4, 1, 5)
    with pytest.raises(EvaluationError, match="c=5 is outside"):
        pass_at_k(4, 5, 1)
    with pytest.raises(EvaluationError, match="at least one sample"):
        pass_at_k(0, 0, 1)
