"""RL batches: trajectories packed in order with groups and versions; per-token outputs computed on
data-parallel shares put back in batch order; step statistics (reward, staleness)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.algo import keys
from areal_tasks.api.train_engine import ParallelInfo
from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import AlgorithmError, TrajectoryError
from areal_tasks.trainer.rl_batch import gather_token_outputs, pack_trajectories, share_of
from areal_tasks.trainer.rl_step import batch_statistics


def traj(prompt: list[int], output: list[int], version: int, reward: float) -> Trajectory:
    n_p, n_o = len(prompt), len(output)
    return Trajectory(
        input_ids=prompt + output,
        loss_mask=[0] * n_p + [1] * n_o,
        logprobs=[0.0] * n_p + [-0.5] * n_o,
        versions=[-1] * n_p + [version] * n_o,
        reward=reward,
        prompt_len=n_p,
    )


def test_pack_keeps_order_groups_and_versions() -> None:
    trajs = [
        traj([1, 2], [3], 0, 1.0),
        traj([1, 2], [4, 5], 1, 0.0),
        traj([7], [8, 9, 10], 1, 0.5),
        traj([7], [8], 0, 0.0),
    ]
    batch = pack_trajectories(trajs, group_size=2, policy_version=2)
    assert batch["input_ids"].tolist() == [1, 2, 3, 1, 2, 4, 5, 7, 8, 9, 10, 7, 8]
    assert batch[keys.CU_SEQLENS].tolist() == [0, 3, 7, 11, 13]
    assert batch["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert batch[keys.GROUP_IDS].tolist() == [0, 0, 1, 1]
    assert batch[keys.REWARDS].tolist() == [1.0, 0.0, 0.5, 0.0]
    assert batch[keys.POLICY_VERSION].tolist() == [2, 2, 2, 2]
    stats = batch_statistics(batch)
    assert stats["reward/mean"] == pytest.approx(0.375)
    # staleness per generated token: version 2 minus (0 | 1,1 | 1,1,1 | 0)
    assert stats["staleness/max"] == 2.0
    assert stats["staleness/mean"] == pytest.approx((2 + 1 + 1 + 1 + 1 + 1 + 2) / 7)
    assert stats["response_len/mean"] == pytest.approx(7 / 4)


def test_pack_rejects_broken_input() -> None:
    with pytest.raises(AlgorithmError, match="groups of 3"):
        pack_trajectories([traj([1], [2], 0, 1.0)] * 2, group_size=3, policy_version=0)
    with pytest.raises(AlgorithmError, match="empty"):
        pack_trajectories([], group_size=1, policy_version=0)
    bad = traj([1], [2], 0, 1.0)
    bad.versions = [-1, -1]
    with pytest.raises(TrajectoryError, match="version"):
        pack_trajectories([bad], group_size=1, policy_version=0)


def test_gather_token_outputs_puts_shares_back_in_batch_order() -> None:
    trajs = [traj([1], [2] * k, 0, 1.0) for k in (1, 4, 2, 3)]
    batch = pack_trajectories(trajs, group_size=1, policy_version=0)
    info = ParallelInfo(world_size=1, rank=0, dp_size=1, dp_rank=0)
    parts = share_of(batch, info, group_size=1)
    assert parts == [[0, 1, 2, 3]]
    values = torch.arange(int(batch[keys.CU_SEQLENS][-1]), dtype=torch.float32)
    out = gather_token_outputs(batch, parts, info, {"x": values})
    assert torch.equal(out["x"], values)
    # a reordered single share: values come back where their sequences are
    reordered = [[2, 0, 3, 1]]
    cu = batch[keys.CU_SEQLENS].tolist()
    local = torch.cat([values[cu[i] : cu[i + 1]] for i in reordered[0]])
    assert torch.equal(gather_token_outputs(batch, reordered, info, {"x": local})["x"], values)
    with pytest.raises(AlgorithmError, match="returned"):
        gather_token_outputs(batch, reordered, info, {"x": local[:-1]})
