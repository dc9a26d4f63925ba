"""Worker functions run by :mod:`launch` for the archon expert-parallel tests, and the case they share
with the single-process reference.

:func:`make_case` builds, from a seed, every rank's tokens, routing and routing weights and the
weights of all experts; a rank keeps its tokens and its ep rank's experts, runs the
:class:`ExpertParallelDispatcher`, backpropagates a fixed weighted sum of the output, and saves the
output and the gradients (tokens, routing weights, its experts' weights) to ``rank{r}.pt``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

H, K = 8, 2


def expert(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One expert: a small nonlinear map, so each weight's gradient depends on the rows it saw."""
    return torch.tanh(x @ w) * 1.5


def loop_compute(weights: torch.Tensor) -> Callable[[torch.Tensor, list[int]], torch.Tensor]:
    """Local experts over rows sorted by local expert, one slice per expert."""

    def compute(x_sorted: torch.Tensor, counts: list[int] | torch.Tensor) -> torch.Tensor:
        counts = counts.tolist() if isinstance(counts, torch.Tensor) else counts
        assert len(counts) == weights.shape[0] and sum(counts) == x_sorted.shape[0], (counts, x_sorted.shape)
        return torch.cat([expert(w, part) for w, part in zip(weights, x_sorted.split(counts), strict=True)])

    return compute


def make_case(
    world: int, ep: int, n_experts: int, tokens: list[int], idle_experts: list[int], seed: int = 0
) -> dict[str, list[torch.Tensor] | torch.Tensor]:
    """Per rank: ``x``, ``index``, ``weight`` and the loss coefficients; and all experts' weights.

    ``idle_experts`` receive no token; rank 0 routes every token to experts of other ep ranks.
    """
    gen = torch.Generator().manual_seed(seed)
    per_rank = n_experts // ep
    case: dict = {"x": [], "index": [], "weight": [], "coef": []}
    for rank in range(world):
        n = tokens[rank]
        scores = torch.rand(n, n_experts, generator=gen)
        scores[:, idle_experts] = -1.0
        if rank == 0:
            scores[:, :per_rank] = -1.0  # rank 0 is also ep rank 0 of its group: its experts get nothing from it
        weight, index = scores.softmax(-1).topk(K, dim=-1)
        assert not torch.isin(index, torch.tensor(idle_experts)).any(), "a case needs k experts left to route to"
        assert rank != 0 or not (index < per_rank).any(), "rank 0 must send every token elsewhere"
        case["x"].append(torch.randn(n, H, generator=gen))
        case["index"].append(index)
        case["weight"].append(weight)
        case["coef"].append(torch.randn(n, H, generator=gen))
    case["experts"] = torch.randn(n_experts, H, H, generator=gen) / H**0.5
    return case


def ep_dispatch(
    rank: int,
    world: int,
    out_dir: Path,
    ep: int,
    n_experts: int,
    tokens: list[int],
    idle_experts: list[int],
    seed: int = 0,
) -> None:
    import torch.distributed as dist

    from areal_tasks.engine.archon.parallel.expert_parallel import ExpertParallelDispatcher

    group, _ = dist.new_subgroups(group_size=ep) if ep < world else (dist.group.WORLD, None)
    case = make_case(world, ep, n_experts, tokens, idle_experts, seed)
    dispatcher = ExpertParallelDispatcher(group)
    mine = dispatcher.local_experts(n_experts)
    experts = case["experts"][mine.start : mine.stop].clone().requires_grad_()
    x = case["x"][rank].clone().requires_grad_()
    weight = case["weight"][rank].clone().requires_grad_()
    out = dispatcher(x, case["index"][rank], weight, n_experts, loop_compute(experts))
    (out * case["coef"][rank]).sum().backward()
    logger.info("rank %d: %d tokens, experts %s", rank, x.shape[0], list(mine))
    result = {"out": out.detach(), "x_grad": x.grad, "weight_grad": weight.grad, "experts": list(mine)}
    result["experts_grad"] = experts.grad
    torch.save(result, out_dir / f"rank{rank}.pt")
