"""KL estimators k1, k2, k3: hand values, zero at equality, sign properties and clamping."""

from __future__ import annotations

import math

import pytest
import torch

from areal_tasks.algo.kl import kl_estimate
from areal_tasks.errors import AlgorithmError


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_is_exactly_zero_when_policy_equals_reference(estimator: str) -> None:
    logp = -torch.rand(50) * 5
    assert torch.equal(kl_estimate(logp, logp.clone(), estimator), torch.zeros(50))


def test_hand_computed_values() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])  # log-ratios 0.5, -1.0
    assert torch.allclose(kl_estimate(logp, ref, "k1"), torch.tensor([0.5, -1.0]))
    assert torch.allclose(kl_estimate(logp, ref, "k2"), torch.tensor([0.125, 0.5]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
    assert torch.allclose(kl_estimate(logp, ref, "k3"), torch.tensor(k3))


def test_k2_k3_are_non_negative_and_k3_is_unbiased_for_kl() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=gen), 0)
    q = torch.softmax(torch.randn(6, generator=gen), 0)
    # exact expectation over samples from p of k3(log p, log q) equals KL(p || q)
    k3 = kl_estimate(p.log(), q.log(), "k3")
    assert torch.allclose((p * k3).sum(), (p * (p / q).log()).sum(), atol=1e-6)
    assert (kl_estimate(p.log(), q.log(), "k2") >= 0).all() and (k3 >= 0).all()


def test_clamping_bounds_log_ratio_and_estimate() -> None:
    logp, ref = torch.tensor([0.0, -50.0]), torch.tensor([-50.0, 0.0])
    assert kl_estimate(logp, ref, "k1", clamp=3.0).tolist() == [3.0, -3.0]
    k3 = kl_estimate(logp, ref, "k3", clamp=3.0)
    assert torch.isfinite(k3).all() and k3.max() <= 3.0
    assert torch.isinf(kl_estimate(torch.tensor([-200.0]), torch.tensor([0.0]), "k3", clamp=None)).all()


def test_gradient_flows_to_policy() -> None:
    logp = torch.tensor([-1.0], requires_grad=True)
    kl_estimate(logp, torch.tensor([-2.0]), "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(1 - math.exp(-1.0))


def test_unknown_estimator() -> None:
    with pytest.raises(AlgorithmError, match="k4"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")
