"""The MoE token dispatchers of the archon engine on one process: :class:`LocalDispatcher` (and the
ep dispatcher over a one-rank group) against a naive loop over tokens and their chosen experts, in
output and in the gradients to the tokens, the routing weights and each expert's weights; the
layout ``compute`` receives; empty inputs and idle experts; dtypes; the errors; and the padded
grouped-GEMM layout (``grouped_layout``, ``pad_rows``, ``unpad_rows``)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.parallel.expert_parallel import (
    ExpertParallelDispatcher,
    LocalDispatcher,
    local_expert_range,
    validate_expert_parallel,
)
from areal_tasks.engine.archon.parallel.grouped_layout import grouped_layout, pad_rows, unpad_rows
from areal_tasks.errors import EngineError

H, E, K = 8, 6, 2


def expert(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One expert: a small nonlinear map, so the gradient depends on the row it sees."""
    return torch.tanh(x @ w) * 1.5


def loop_compute(weights: torch.Tensor):
    """Local experts over rows sorted by expert, one slice per expert (as the model's loop kernel)."""

    def compute(x_sorted: torch.Tensor, counts: list[int]) -> torch.Tensor:
        assert len(counts) == weights.shape[0] and sum(counts) == x_sorted.shape[0]
        return torch.cat([expert(w, part) for w, part in zip(weights, x_sorted.split(counts), strict=True)])

    return compute


def naive(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    rows = []
    for n in range(x.shape[0]):
        row = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(index.shape[1]):
            row = row + weight[n, j].to(x.dtype) * expert(weights[int(index[n, j])], x[n])
        rows.append(row)
    return torch.stack(rows) if rows else x.new_zeros(0, x.shape[1]) + 0 * weights.sum()


def routing(n: int, seed: int = 0, idle: int | None = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, E, generator=gen)
    if idle is not None:
        scores[:, idle] = -1.0  # expert ``idle`` receives no token
    weight, index = scores.softmax(-1).topk(K, dim=-1)
    return index, weight


def leaves(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(n, H, generator=gen, requires_grad=True)
    weights = (torch.randn(E, H, H, generator=gen) / H**0.5).requires_grad_()
    return x, weights


def outputs_and_grads(dispatch, n: int, seed: int = 0, idle: int | None = 3):
    x, weights = leaves(n, seed)
    index, weight = routing(n, seed, idle)
    weight = weight.requires_grad_()
    out = dispatch(x, index, weight, weights)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad, weight.grad, weights.grad


def _compare(dispatch, n: int, idle: int | None = 3) -> None:
    got = outputs_and_grads(dispatch, n, idle=idle)
    want = outputs_and_grads(naive, n, idle=idle)
    for name, g, w in zip(("output", "x.grad", "top_k_weight.grad", "expert grad"), got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def _local(x, index, weight, weights):
    return LocalDispatcher()(x, index, weight, E, loop_compute(weights))


@pytest.mark.parametrize("n", [1, 7, 40])
def test_local_dispatcher_equals_a_loop_over_tokens(n):
    _compare(_local, n)


def test_local_dispatcher_with_every_expert_used(n=40):
    _compare(_local, n, idle=None)


def test_no_token(n=0):
    x, weights = leaves(0)
    index, weight = routing(0)
    out = LocalDispatcher()(x, index, weight, E, loop_compute(weights))
    assert out.shape == (0, H)
    out.sum().backward()
    assert x.grad.shape == (0, H)


def test_ep_dispatcher_on_one_rank_equals_the_loop(world_of_one):
    group = torch.distributed.new_group([0])

    def dispatch(x, index, weight, weights):
        return ExpertParallelDispatcher(group)(x, index, weight, E, loop_compute(weights))

    _compare(dispatch, 23)


def test_compute_sees_rows_sorted_by_expert():
    x = torch.arange(5, dtype=torch.float32).unsqueeze(1).repeat(1, H)
    index = torch.tensor([[2, 0], [0, 1], [2, 1], [5, 0], [1, 2]])
    seen = {}

    def compute(x_sorted, counts):
        seen["rows"], seen["counts"] = x_sorted[:, 0].tolist(), counts
        return x_sorted

    LocalDispatcher()(x, index, torch.ones(5, 2), E, compute)
    assert seen["counts"] == [3, 3, 3, 0, 0, 1]
    # expert 0: tokens 0, 1, 3; expert 1: tokens 1, 2, 4; expert 2: tokens 0, 2, 4; expert 5: token 3
    assert seen["rows"] == [0, 1, 3, 1, 2, 4, 0, 2, 4, 3]


def test_output_keeps_the_dtype_of_x():
    x, weights = leaves(9)
    index, weight = routing(9)
    out = LocalDispatcher()(x.detach().bfloat16(), index, weight, E, loop_compute(weights.detach().bfloat16()))
    assert out.dtype == torch.bfloat16


def test_bad_inputs_are_named():
    x, weights = leaves(4)
    index, weight = routing(4)
    with pytest.raises(EngineError, match="top_k_index must be torch.long"):
        LocalDispatcher()(x, index.int(), weight, E, loop_compute(weights))
    with pytest.raises(EngineError, match="top_k_weight shape"):
        LocalDispatcher()(x, index, weight[:, :1], E, loop_compute(weights))
    with pytest.raises(EngineError, match="expert compute returned shape"):
        LocalDispatcher()(x, index, weight, E, lambda xs, counts: xs[:, :2])


def test_validate_expert_parallel_names_the_fields():
    assert validate_expert_parallel(8, 4) == 2
    assert validate_expert_parallel(8, 2, dp=4) == 4
    with pytest.raises(EngineError, match=r"n_experts = 6 is not divisible by the expert parallel size ep = 4"):
        validate_expert_parallel(6, 4)
    with pytest.raises(EngineError, match=r"ep = 4 does not divide the data-parallel size dp = 6"):
        validate_expert_parallel(8, 4, dp=6)
    with pytest.raises(EngineError, match="ep must be an integer >= 1"):
        validate_expert_parallel(8, 0)
    assert local_expert_range(8, 4, 3) == range(6, 8)


def test_grouped_layout_pads_each_group_to_the_alignment():
    layout = grouped_layout([3, 0, 8, 9], alignment=8)
    assert layout.padded_counts == (8, 0, 8, 16)
    assert layout.starts == (0, 8, 8, 16)
    assert layout.offsets == (8, 8, 16, 32) and layout.total == 32
    assert layout.offsets_tensor("cpu").dtype == torch.int32
    assert grouped_layout([0, 2], alignment=4, min_rows=1).padded_counts == (4, 4)
    assert grouped_layout([], alignment=8).total == 0
    with pytest.raises(EngineError, match="alignment must be an integer >= 1"):
        grouped_layout([1], alignment=0)
    with pytest.raises(EngineError, match="group counts must be >= 0"):
        grouped_layout([1, -1])


def test_pad_and_unpad_rows_round_trip_with_gradients():
    counts = [3, 0, 1, 9]
    layout = grouped_layout(counts, alignment=4)
    x = torch.randn(sum(counts), H, requires_grad=True)
    padded = pad_rows(x, layout)
    assert padded.shape == (layout.total, H)
    for g, (start, count, size) in enumerate(zip(layout.starts, counts, layout.padded_counts, strict=True)):
        group = padded[start : start + size]
        first = sum(counts[:g])
        torch.testing.assert_close(group[:count], x[first : first + count].detach(), atol=0, rtol=0)
        assert not group[count:].any(), "padding rows are zero"
    back = unpad_rows(padded * 2, layout)
    torch.testing.assert_close(back, x.detach() * 2, atol=0, rtol=0)
    back.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0), atol=0, rtol=0)
    with pytest.raises(EngineError, match="the layout's counts sum to 13"):
        pad_rows(x[:2], layout)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm is missing")
def test_the_padded_layout_feeds_grouped_mm():
    """``torch._grouped_mm`` over the padded rows with the layout's offsets equals a matmul per group."""
    counts = [5, 0, 11, 2]
    layout = grouped_layout(counts, alignment=8)
    x = torch.randn(sum(counts), H)
    weights = torch.randn(len(counts), H, 16)
    y = unpad_rows(torch._grouped_mm(pad_rows(x, layout), weights, offs=layout.offsets_tensor("cpu")), layout)
    want = torch.cat([part @ w for part, w in zip(x.split(counts), weights, strict=True)])
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
