"""PPO clipped surrogate (asymmetric, dual clip) and the clipped critic loss."""

from __future__ import annotations

import math

import pytest
import torch

from areal_tasks.algo.losses import ppo_surrogate, value_loss
from areal_tasks.errors import AlgorithmError


def _grad(ratio: float, adv: float, **kw: float | None) -> tuple[float, float]:
    """(loss, d loss / d log pi) of one token with the given ratio and advantage."""
    logp = torch.tensor([math.log(ratio)], requires_grad=True)
    out = ppo_surrogate(torch.exp(logp), torch.tensor([adv]), **kw)
    out.loss.sum().backward()
    return out.loss.item(), logp.grad.item()


def test_hand_computed_surrogate() -> None:
    out = ppo_surrogate(torch.tensor([1.5, 0.5, 1.0, 0.5, 1.5]), torch.tensor([2.0, 2.0, 1.0, -1.0, -1.0]))
    assert torch.allclose(out.loss, torch.tensor([-2.4, -1.0, -1.0, 0.8, 1.5]))
    assert out.clipped.tolist() == [True, False, False, True, False]


@pytest.mark.parametrize(
    ("ratio", "adv", "vanishes"),
    [
        (1.5, 1.0, True),  # A > 0 beyond 1 + eps: no further push up
        (0.5, 1.0, False),  # A > 0 below 1 - eps: still pushed up
        (0.5, -1.0, True),  # A < 0 below 1 - eps: no further push down
        (1.5, -1.0, False),  # A < 0 above 1 + eps: still pushed down
        (1.1, 1.0, False),
        (0.9, -1.0, False),
    ],
)
def test_gradient_vanishes_outside_trust_region_only_in_the_advantage_direction(
    ratio: float, adv: float, vanishes: bool
) -> None:
    _, grad = _grad(ratio, adv, eps_low=0.2)
    if vanishes:
        assert grad == 0.0
    else:
        # minimising the loss moves log pi in the direction of the advantage: grad = -ratio * A
        assert grad == pytest.approx(-ratio * adv)


def test_asymmetric_clip_higher() -> None:
    assert _grad(1.25, 1.0, eps_low=0.2, eps_high=0.28)[1] == pytest.approx(-1.25)
    assert _grad(1.30, 1.0, eps_low=0.2, eps_high=0.28)[1] == 0.0
    assert _grad(0.75, -1.0, eps_low=0.2, eps_high=0.28)[1] == 0.0


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    loss, grad = _grad(4.0, -1.0, eps_low=0.2, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0
    loss, grad = _grad(2.0, -1.0, eps_low=0.2, dual_clip=3.0)
    assert loss == pytest.approx(2.0) and grad == pytest.approx(2.0)
    out = ppo_surrogate(torch.tensor([4.0, 4.0]), torch.tensor([-1.0, 1.0]), dual_clip=3.0)
    assert out.dual_clipped.tolist() == [True, False]
    with pytest.raises(AlgorithmError, match="dual_clip"):
        ppo_surrogate(torch.ones(1), torch.ones(1), dual_clip=0.5)


def test_value_loss_clipping_mse_and_huber() -> None:
    values = torch.tensor([1.5, 0.9], requires_grad=True)
    old, ret = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0])
    loss, clipped = value_loss(values, old, ret, clip=0.2, kind="mse")
    # token 0: plain 0.5*0.25, clipped pred 1.2 -> 0.5*0.64 (binding); token 1 inside the clip
    assert torch.allclose(loss, torch.tensor([0.32, 0.605]))
    assert clipped.tolist() == [True, False]
    loss.sum().backward()
    assert torch.allclose(values.grad, torch.tensor([0.0, -1.1]))
    huber, _ = value_loss(torch.tensor([4.0, 2.5]), torch.tensor([4.0, 2.5]), ret, clip=None, kind="huber")
    assert torch.allclose(huber, torch.tensor([1.5, 0.125]))
