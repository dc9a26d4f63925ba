"""Invariants of the FFD and Karmarkar-Karp partitioners in ``areal_tasks.engine.packing``."""

from __future__ import annotations

import logging
import random

import pytest

from areal_tasks.engine.packing import part_sums, partition
from areal_tasks.errors import ConfigError, EngineError

METHODS = ("ffd", "kk")


def _random_case(seed: int) -> tuple[list[int], int, int, int]:
    """Long-tailed lengths, a granularity, a cap that admits every unit, and a min part count."""
    rng = random.Random(seed)
    granularity = rng.choice([1, 1, 2, 4])
    n = granularity * rng.randint(1, 40)
    lengths = [max(1, min(4000, int(rng.lognormvariate(5, 1)))) for _ in range(n)]
    biggest_unit = max(sum(lengths[i : i + granularity]) for i in range(0, n, granularity))
    cap = rng.choice([None, biggest_unit, biggest_unit * 2, biggest_unit * 5])
    return lengths, granularity, cap, rng.randint(1, 6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(40))
def test_random_partitions_keep_every_invariant(method: str, seed: int) -> None:
    lengths, granularity, cap, min_parts = _random_case(seed)
    parts = partition(lengths, max_tokens=cap, min_parts=min_parts, method=method, granularity=granularity)

    flat = sorted(i for part in parts for i in part)
    assert flat == list(range(len(lengths))), "every index exactly once"
    assert all(part for part in parts), "no empty part"
    if cap is not None:
        assert max(part_sums(lengths, parts)) <= cap
    n_units = len(lengths) // granularity
    assert len(parts) >= min(min_parts, n_units)
    where = {i: k for k, part in enumerate(parts) for i in part}
    for start in range(0, len(lengths), granularity):
        assert len({where[i] for i in range(start, start + granularity)}) == 1, "a group was split"
    assert parts == partition(lengths, max_tokens=cap, min_parts=min_parts, method=method, granularity=granularity)


@pytest.mark.parametrize("method", METHODS)
def test_parts_are_sorted_and_output_is_independent_of_sequence_type(method: str) -> None:
    lengths = [5, 3, 9, 1, 7, 7, 2, 8]
    parts = partition(lengths, max_tokens=12, min_parts=2, method=method)
    assert all(part == sorted(part) for part in parts)
    assert [part[0] for part in parts] == sorted(part[0] for part in parts)
    assert parts == partition(tuple(lengths), max_tokens=12, min_parts=2, method=method)


def _balance(lengths: list[int], parts: list[list[int]]) -> float:
    sums = part_sums(lengths, parts)
    return max(sums) / (sum(sums) / len(sums))


def test_kk_is_at_least_as_balanced_as_ffd_on_random_cases() -> None:
    rng = random.Random(1234)
    worse = []
    for trial in range(30):
        lengths = [max(1, min(8192, int(rng.lognormvariate(6, 1)))) for _ in range(rng.randint(20, 200))]
        cap = max(lengths) * rng.choice([2, 3, 4])
        ffd = partition(lengths, max_tokens=cap, min_parts=1, method="ffd")
        kk = partition(lengths, max_tokens=cap, min_parts=1, method="kk")
        if _balance(lengths, kk) > _balance(lengths, ffd) + 1e-9:
            worse.append((trial, _balance(lengths, kk), _balance(lengths, ffd)))
        forced_ffd = partition(lengths, max_tokens=None, min_parts=7, method="ffd")
        forced_kk = partition(lengths, max_tokens=None, min_parts=7, method="kk")
        assert len(forced_ffd) == len(forced_kk) == 7
        if _balance(lengths, forced_kk) > _balance(lengths, forced_ffd) + 1e-9:
            worse.append((trial, "forced", _balance(lengths, forced_kk), _balance(lengths, forced_ffd)))
    assert not worse


def test_ffd_packs_a_perfect_instance_into_the_fewest_parts() -> None:
    lengths = [6, 4, 6, 4, 5, 5, 3, 7]
    parts = partition(lengths, max_tokens=10, min_parts=1, method="ffd")
    assert len(parts) == 4
    assert part_sums(lengths, parts) == [10, 10, 10, 10]


def test_kk_equalises_an_easy_instance() -> None:
    lengths = [10, 10, 1, 1]
    parts = partition(lengths, max_tokens=None, min_parts=2, method="kk")
    assert sorted(part_sums(lengths, parts)) == [11, 11]


@pytest.mark.parametrize("method", METHODS)
def test_kk_and_ffd_grow_past_min_parts_when_the_cap_needs_it(method: str) -> None:
    lengths = [100] * 10
    parts = partition(lengths, max_tokens=250, min_parts=2, method=method)
    assert len(parts) == 5
    assert max(part_sums(lengths, parts)) <= 250


@pytest.mark.parametrize("method", METHODS)
def test_no_cap_and_one_part_keeps_everything_together(method: str) -> None:
    assert partition([3, 1, 2], max_tokens=None, min_parts=1, method=method) == [[0, 1, 2]]


@pytest.mark.parametrize("method", METHODS)
def test_oversize_unit_raises_a_clear_error(method: str) -> None:
    with pytest.raises(EngineError, match=r"sequence 1 holds 900 tokens, more than max_tokens=512"):
        partition([10, 900, 20], max_tokens=512, min_parts=1, method=method)
    with pytest.raises(EngineError, match=r"sequences 2\.\.3 holds 600 tokens"):
        partition([10, 10, 300, 300], max_tokens=512, min_parts=1, method=method, granularity=2)


@pytest.mark.parametrize("method", METHODS)
def test_fewer_units_than_min_parts_gives_one_part_per_unit_and_warns(
    method: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="areal_tasks.engine.packing"):
        parts = partition([4, 4, 9, 9], max_tokens=None, min_parts=5, method=method, granularity=2)
    assert parts == [[0, 1], [2, 3]]
    assert "only 2 unit(s)" in caplog.text


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(ConfigError, match="packing method"):
        partition([1, 2], max_tokens=None, method="greedy")
    with pytest.raises(ConfigError, match="min_parts"):
        partition([1, 2], max_tokens=None, min_parts=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        partition([1, 2], max_tokens=0)
    with pytest.raises(EngineError, match="length 0"):
        partition([1, 0], max_tokens=None)
    with pytest.raises(EngineError, match="whole number of units"):
        partition([1, 2, 3], max_tokens=None, granularity=2)
    assert partition([], max_tokens=None, min_parts=3) == []
