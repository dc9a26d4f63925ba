"""Reward shaping, DAPO's overlong penalty, and DAPO's dynamic-sampling group filter."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.algo.filters import informative_group
from areal_tasks.algo.shaping import overlong_penalty, shape_rewards
from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import AlgorithmError


def test_shape_rewards_bias_scale_clip() -> None:
    r = torch.tensor([-3.0, 0.0, 1.0, 4.0])
    assert shape_rewards(r, bias=-0.5, scale=2.0).tolist() == [-7.0, -1.0, 1.0, 7.0]
    assert shape_rewards(r, bias=-0.5, scale=2.0, clip=5.0).tolist() == [-5.0, -1.0, 1.0, 5.0]
    assert torch.equal(shape_rewards(r), r)


def test_overlong_penalty_is_dapo_piecewise_ramp() -> None:
    # L_max = 10, L_cache = 4: no penalty up to 6, linear to -1 at 10, -1 beyond
    lengths = torch.tensor([1, 6, 7, 8, 10, 11, 500])
    out = overlong_penalty(lengths, max_len=10, buffer_len=4, factor=0.5)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5, -0.5]))
    hard = overlong_penalty(lengths, max_len=10, buffer_len=0)
    assert hard.tolist() == [0, 0, 0, 0, 0, -1, -1]
    with pytest.raises(AlgorithmError, match="buffer_len"):
        overlong_penalty(lengths, max_len=4, buffer_len=4)


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal() -> None:
    groups = [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0], [0.7], [0.2, 0.3]]
    kept = [informative_group([_traj(r) for r in rewards]) for rewards in groups]
    assert kept == [False, True, False, False, True]


def _traj(reward: float) -> Trajectory:
    return Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], reward=reward, prompt_len=1)
