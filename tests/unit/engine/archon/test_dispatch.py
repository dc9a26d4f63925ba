"""The MoE token dispatchers of the archon engine on one process: :class:`LocalDispatcher` (and the
ep dispatcher over a one-rank group) against a naive loop over tokens and their chosen experts, in
output and in the gradients to the tokens, the routing weights and each expert's weights; the
layout ``compute`` receives; empty inputs and idle experts; dtypes; the errors."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model.experts import LocalDispatcher
from areal_tasks.engine.archon.parallel.expert_parallel import (
    ExpertParallelDispatcher,
    local_expert_range,
    validate_expert_parallel,
)
from areal_tasks.errors import EngineError

H, E, K = 8, 6, 2


def expert(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One expert: a small nonlinear map, so the gradient depends on the row it sees."""
    return torch.tanh(x @ w) * 1.5


def loop_compute(weights: torch.Tensor):
    """Local experts over rows sorted by expert, one slice per expert (as the model's loop kernel)."""

    def compute(x_sorted: torch.Tensor, counts: list[int] | torch.Tensor) -> torch.Tensor:
        counts = counts.tolist() if isinstance(counts, torch.Tensor) else counts
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
        seen["rows"], seen["counts"] = x_sorted[:, 0].tolist(), [int(c) for c in counts]
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
