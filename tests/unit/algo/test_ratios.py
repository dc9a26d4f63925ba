"""Token and sequence importance ratios, the log-linear proximal approximation, behaviour weights."""

from __future__ import annotations

import math

import pytest
import torch

from areal_tasks.algo.ratios import behaviour_weights, importance_ratio, loglinear_prox_logprobs
from areal_tasks.errors import AlgorithmError

CU = torch.tensor([0, 3, 6], dtype=torch.int32)
MASK = torch.tensor([0, 1, 1, 0, 1, 1], dtype=torch.bool)


def test_token_ratio_ignores_untrained_tokens() -> None:
    logp = torch.tensor([5.0, -1.0, -2.0, float("nan"), -1.0, -1.0])
    old = torch.tensor([0.0, -1.5, -2.0, 0.0, -0.5, -1.0])
    ratio = importance_ratio(logp, old, MASK)
    assert torch.allclose(ratio, torch.tensor([1.0, math.exp(0.5), 1.0, 1.0, math.exp(-0.5), 1.0]))


def test_sequence_ratio_is_geometric_mean_and_gspo_gradient() -> None:
    logp = torch.tensor([0.0, -1.0, -2.0, 0.0, -1.0, -1.0], requires_grad=True)
    old = torch.tensor([0.0, -1.5, -2.5, 0.0, -0.5, -1.5])
    ratio = importance_ratio(logp, old, MASK, CU, level="sequence")
    s1, s2 = math.exp(0.5), math.exp(0.0)
    assert torch.allclose(ratio, torch.tensor([s1, s1, s1, s2, s2, s2]))
    # d s_1 / d logp_t = s_1 / |y_1| for the trained tokens of sequence 1
    ratio[1].backward()
    assert torch.allclose(logp.grad, torch.tensor([0.0, s1 / 2, s1 / 2, 0.0, 0.0, 0.0]))


def test_sequence_ratio_needs_cu_seqlens() -> None:
    with pytest.raises(AlgorithmError, match="cu_seqlens"):
        importance_ratio(torch.zeros(6), torch.zeros(6), MASK, None, level="sequence")


def test_loglinear_alpha_from_versions() -> None:
    behav = torch.tensor([0.0, -1.0, -1.0, -2.0])
    current = torch.tensor([0.0, -0.5, -0.5, -1.0], requires_grad=True)
    versions = torch.tensor([-1, 3, 2, 0])  # trainer holds version 3
    prox = loglinear_prox_logprobs(behav, current, versions, 3)
    # alpha = (3 - v) / (4 - v): v=3 -> 0, v=2 -> 1/2, v=0 -> 3/4; prompt -> behaviour
    assert torch.allclose(prox, torch.tensor([0.0, -1.0, -1.0 + 0.5 * 0.5, -2.0 + 0.75 * 1.0]))
    assert not prox.requires_grad
    with pytest.raises(AlgorithmError, match="newer"):
        loglinear_prox_logprobs(behav, current, torch.tensor([-1, 4, 2, 0]), 3)


def test_behaviour_weight_token_truncate_and_mask() -> None:
    prox = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    behav = torch.tensor([0.0, -2.0, 0.5, 0.0, -0.1, 0.0])
    raw = [0.0, math.exp(2.0), math.exp(-0.5), 0.0, math.exp(0.1), 1.0]
    out = behaviour_weights(prox, behav, MASK, cap=2.0, mode="truncate")
    assert torch.allclose(out.weights, torch.tensor([0.0, 2.0, raw[2], 0.0, raw[4], 1.0]))
    assert torch.allclose(out.raw, torch.tensor(raw))
    assert out.capped.tolist() == [False, True, False, False, False, False]
    masked = behaviour_weights(prox, behav, MASK, cap=2.0, mode="mask")
    assert torch.allclose(masked.weights, torch.tensor([0.0, 0.0, raw[2], 0.0, raw[4], 1.0]))


def test_behaviour_weight_sequence_level_masks_whole_sequence() -> None:
    prox = torch.zeros(6)
    behav = torch.tensor([0.0, -2.0, 0.0, 0.0, -0.2, 0.0])  # sequence 1 mean log w = 1, sequence 2 = 0.1
    out = behaviour_weights(prox, behav, MASK, CU, level="sequence", cap=2.0, mode="mask")
    w2 = math.exp(0.1)
    assert torch.allclose(out.weights, torch.tensor([0.0, 0.0, 0.0, 0.0, w2, w2]))
    assert out.capped.tolist() == [False, True, True, False, False, False]
