"""Loss aggregation modes: hand values in both layouts, and the micro-batch weight contract."""

from __future__ import annotations

import itertools

import pytest
import torch

from areal_tasks.algo.aggregate import MODES, aggregate_loss, loss_weight
from areal_tasks.algo.layout import packed_to_padded
from areal_tasks.errors import AlgorithmError

# sequences: [1, 2, 3] with 2 trained tokens, [4] with none, [5, 6, 7] all trained
VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
MASK = torch.tensor([1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
CU = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
EXPECTED = {  # mode: (value, units)
    "token_mean": (21 / 5, 5.0),
    "seq_mean_token_sum": (21 / 2, 2.0),
    "seq_mean_token_mean": ((1.5 + 6.0) / 2, 2.0),
    "seq_mean_token_sum_norm": (21 / (2 * 10), 20.0),
}


@pytest.mark.parametrize("mode", MODES)
def test_hand_values_in_packed_and_padded_layouts(mode: str) -> None:
    value, units = EXPECTED[mode]
    assert aggregate_loss(VALUES, MASK, CU, mode, constant=10).item() == pytest.approx(value)
    assert loss_weight(MASK, CU, mode, constant=10) == units
    padded, _ = packed_to_padded(VALUES, CU)
    padded_mask, _ = packed_to_padded(MASK, CU, pad_value=False)
    assert aggregate_loss(padded, padded_mask, None, mode, constant=10).item() == pytest.approx(value)
    assert loss_weight(padded_mask, None, mode, constant=10) == units


@pytest.mark.parametrize("mode", MODES)
def test_weighted_micro_batches_reproduce_full_batch_loss_and_gradient(mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([3, 5, 1, 4, 6, 2])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    mask = torch.rand(int(lens.sum()), generator=gen) > 0.3
    mask[int(cu[2]) : int(cu[3])] = False  # one sequence with no trained token
    theta = torch.randn(int(lens.sum()), generator=gen, requires_grad=True)

    def per_token(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * x

    full = aggregate_loss(per_token(theta), mask, cu, mode, constant=8)
    (grad_full,) = torch.autograd.grad(full, theta)
    bounds = [0, 2, 3, 6]
    mbs = [(int(cu[a]), int(cu[b]), cu[a : b + 1] - cu[a]) for a, b in itertools.pairwise(bounds)]
    total_weight = sum(loss_weight(mask[t0:t1], c, mode, constant=8) for t0, t1, c in mbs)
    total = sum(
        aggregate_loss(per_token(theta[t0:t1]), mask[t0:t1], c, mode, constant=8)
        * loss_weight(mask[t0:t1], c, mode, constant=8)
        / total_weight
        for t0, t1, c in mbs
    )
    (grad_split,) = torch.autograd.grad(total, theta)
    assert total.item() == pytest.approx(full.item(), rel=1e-6)
    assert torch.allclose(grad_split, grad_full, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_empty_micro_batch_is_finite_zero_with_gradient(mode: str) -> None:
    x = torch.randn(4, requires_grad=True)
    mask = torch.zeros(4, dtype=torch.bool)
    cu = torch.tensor([0, 2, 4])
    loss = aggregate_loss(x, mask, cu, mode, constant=4)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros(4))
    assert loss_weight(mask, cu, mode, constant=4) == 0.0


def test_bad_mode_and_missing_constant() -> None:
    with pytest.raises(AlgorithmError, match="mode"):
        aggregate_loss(VALUES, MASK, CU, "sum")
    with pytest.raises(AlgorithmError, match="constant"):
        loss_weight(MASK, CU, "seq_mean_token_sum_norm")
