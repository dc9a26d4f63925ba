"""Normalisation at batch and group level, leave-one-out baselines, and the zero/empty edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from areal_tasks.algo.normalize import normalize
from areal_tasks.errors import AlgorithmError

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
G = torch.tensor([7, 7, 7, 7, 3, 3])


def test_group_mean_and_std() -> None:
    out = normalize(R, mean_level="group", std_level="group", group_ids=G, eps=0.0)
    s1 = math.sqrt(1 / 3)  # Bessel std of [1, 0, 0, 1]
    s2 = math.sqrt(2.0)  # of [2, 4]
    expected = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, -1 / s2, 1 / s2]
    assert torch.allclose(out, torch.tensor(expected), atol=1e-6)


def test_mean_and_std_levels_are_independent() -> None:
    group_mean_only = normalize(R, mean_level="group", std_level="none", group_ids=G)
    assert group_mean_only.tolist() == [0.5, -0.5, -0.5, 0.5, -1.0, 1.0]
    batch_std = torch.tensor(R.tolist()).std().item()
    mixed = normalize(R, mean_level="group", std_level="batch", group_ids=G, eps=0.0)
    assert torch.allclose(mixed, group_mean_only / batch_std, atol=1e-6)
    batch = normalize(R, mean_level="batch", std_level="none")
    assert torch.allclose(batch, R - R.mean())


def test_leave_one_out_baseline() -> None:
    out = normalize(R, mean_level="group", std_level="none", group_ids=G, leave_one_out=True)
    # group [1, 0, 0, 1]: baselines [1/3, 2/3, 2/3, 1/3]; group [2, 4]: baselines [4, 2]
    assert torch.allclose(out, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0]))
    # leave-one-out advantages are the plain ones scaled by k / (k - 1)
    plain = normalize(R, mean_level="group", std_level="none", group_ids=G)
    assert torch.allclose(out[:4], plain[:4] * 4 / 3)


def test_single_sample_group_and_zero_std_give_zeros_not_nan() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1])
    for loo in (False, True):
        out = normalize(rewards, mean_level="group", std_level="group", group_ids=groups, leave_one_out=loo)
        assert torch.isfinite(out).all()
        assert out.abs().max() < 1e-6


def test_masked_entries_take_no_part_and_fully_masked_groups_are_zero() -> None:
    x = torch.tensor([1.0, 3.0, 100.0, float("nan"), float("inf")])
    groups = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([True, True, False, False, False])
    out = normalize(x, mean_level="group", std_level="none", group_ids=groups, mask=mask)
    assert out.tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0]


def test_float64_accumulation_keeps_small_differences_on_a_large_offset() -> None:
    x = torch.full((4096,), 1.0e4, dtype=torch.float32)
    x[::2] += 0.5
    out = normalize(x, mean_level="batch", std_level="batch", eps=0.0)
    assert out.dtype == torch.float32
    # std = 0.25 * sqrt(n / (n - 1)); a float32 sum of squares (~4e11) would lose it entirely
    expected = math.sqrt(4095 / 4096)
    assert torch.allclose(out[::2], torch.tensor(expected)) and torch.allclose(out[1::2], torch.tensor(-expected))


def test_bad_level_or_missing_groups_raise() -> None:
    with pytest.raises(AlgorithmError, match="mean_level"):
        normalize(R, mean_level="global")
    with pytest.raises(AlgorithmError, match="group_ids"):
        normalize(R, mean_level="group", std_level="none")
