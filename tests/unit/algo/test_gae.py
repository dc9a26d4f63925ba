"""GAE against hand-computed values, the reward-to-go property, and packed == padded."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.algo.gae import gae_packed, gae_padded
from areal_tasks.errors import AlgorithmError


def test_gae_hand_computed_with_critic() -> None:
    # trained tokens 0, 1, 3 (position 2 is skipped): r = [0, 1, 2], V = [0.5, 0.5, 1.0]
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.5, 9.0, 1.0]])
    mask = torch.tensor([[1, 1, 0, 1]])
    adv, ret = gae_padded(rewards, values, mask, gamma=0.9, lam=0.8)
    # A2 = 2 - 1 = 1; A1 = (1 + 0.9 * 1 - 0.5) + 0.72 * 1 = 2.12; A0 = (0 + 0.45 - 0.5) + 0.72 * 2.12
    expected = torch.tensor([[-0.05 + 0.72 * 2.12, 2.12, 0.0, 1.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, expected + torch.tensor([[0.5, 0.5, 0.0, 1.0]]), atol=1e-6)


def test_gamma_lambda_one_without_critic_is_reward_to_go() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 7, generator=gen)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, :] = False
    adv, ret = gae_padded(rewards, None, mask, 1.0, 1.0)
    masked = torch.where(mask, rewards, 0.0)
    to_go = masked.flip(1).cumsum(1).flip(1)
    assert torch.allclose(adv, torch.where(mask, to_go, 0.0), atol=1e-6)
    assert torch.equal(adv, ret)
    assert adv[2].abs().sum() == 0  # fully masked row: zeros, no NaN


def test_discounted_reward_to_go_without_critic() -> None:
    adv, _ = gae_padded(torch.tensor([[1.0, 0.0, 4.0]]), None, torch.ones(1, 3), gamma=0.5, lam=1.0)
    assert adv.tolist() == [[2.0, 2.0, 4.0]]


def test_packed_matches_padded() -> None:
    gen = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 4, 4, 9, 12], dtype=torch.int32)
    rewards, values = torch.randn(12, generator=gen), torch.randn(12, generator=gen)
    mask = torch.rand(12, generator=gen) > 0.3
    adv, ret = gae_packed(rewards, values, mask, cu, 0.95, 0.9)
    for lo, hi in [(0, 4), (4, 9), (9, 12)]:
        a, r = gae_padded(rewards[lo:hi][None], values[lo:hi][None], mask[lo:hi][None], 0.95, 0.9)
        assert torch.allclose(adv[lo:hi], a[0], atol=1e-6)
        assert torch.allclose(ret[lo:hi], r[0], atol=1e-6)
    assert torch.all(adv[~mask] == 0)


def test_invalid_rates_are_rejected() -> None:
    with pytest.raises(AlgorithmError, match="gamma"):
        gae_padded(torch.zeros(1, 2), None, torch.ones(1, 2), gamma=1.5)
