"""Packed <-> padded conversion and per-sequence reductions on hand-built examples."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.algo.layout import (
    broadcast_to_tokens,
    cu_seqlens_from_mask,
    last_masked_index,
    masked_segment_mean,
    packed_to_padded,
    padded_to_packed,
    segment_sum,
    sequence_index,
)
from areal_tasks.errors import AlgorithmError

CU = torch.tensor([0, 3, 3, 5], dtype=torch.int32)  # lengths 3, 0, 2


def test_packed_padded_round_trip_with_an_empty_sequence() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    padded, valid = packed_to_padded(x, CU, pad_value=-1.0)
    assert padded.tolist() == [[1, 2, 3], [-1, -1, -1], [4, 5, -1]]
    assert valid.tolist() == [[True] * 3, [False] * 3, [True, True, False]]
    assert torch.equal(padded_to_packed(padded, CU), x)
    assert torch.equal(cu_seqlens_from_mask(valid), CU)


def test_packed_to_padded_is_differentiable() -> None:
    x = torch.arange(5.0, requires_grad=True)
    padded, _ = packed_to_padded(x, CU)
    (padded * torch.arange(9.0).view(3, 3)).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 2.0, 6.0, 7.0]


def test_segment_reductions() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    mask = torch.tensor([0, 1, 1, 1, 0])
    assert segment_sum(x, CU).tolist() == [6.0, 0.0, 9.0]
    assert masked_segment_mean(x, mask, CU).tolist() == [2.5, 0.0, 4.0]
    assert broadcast_to_tokens(torch.tensor([7.0, 8.0, 9.0]), CU).tolist() == [7, 7, 7, 9, 9]
    assert last_masked_index(mask, CU).tolist() == [2, -1, 3]
    assert sequence_index(CU).tolist() == [0, 0, 0, 2, 2]


def test_mismatched_cu_seqlens_is_an_algorithm_error() -> None:
    with pytest.raises(AlgorithmError, match="covers 5 tokens"):
        segment_sum(torch.ones(4), CU)
    with pytest.raises(AlgorithmError, match="non-decreasing"):
        segment_sum(torch.ones(3), torch.tensor([0, 4, 3]))
