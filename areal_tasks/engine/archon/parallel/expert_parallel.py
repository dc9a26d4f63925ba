"""Token dispatch for MoE layers: to the experts that a router chose, through them, and back.

An MoE layer routes each of its ``N`` tokens to ``k`` of ``E`` experts. A dispatcher owns the data
movement around the expert compute, so that the model's ``GroupedExperts`` stays the same whether
its experts all live on this rank (:class:`LocalDispatcher`) or are split over an expert-parallel
group (:class:`ExpertParallelDispatcher`). Both are called as::

    dispatcher(x [N, H], top_k_index [N, k] long, top_k_weight [N, k], n_experts, compute) -> [N, H]

where ``compute(x_sorted [M, H], counts_local: list[int]) -> [M, H]`` runs this rank's local
experts on rows sorted by local expert id (``counts_local[e]`` rows for local expert ``e``, in
order). The result is ``sum_j top_k_weight[n, j] * expert_{top_k_index[n, j]}(x[n])``, with the
weights cast to the dtype of ``x`` before the product (as HF's MoE blocks do), so a bf16 model
stays in bf16.

Expert parallelism is dropless: no token is dropped and no expert has a capacity. Ep rank ``r``
holds experts ``[r * E / ep, (r + 1) * E / ep)``. The ``N * k`` (token, expert) pairs are sorted
by expert (so they are also grouped by destination rank), the per-expert counts are exchanged with
one small all-to-all, the rows with an uneven-split all-to-all, regrouped by local expert (rows of
several source ranks for one expert made contiguous), computed, and sent back the same way.

Host reads: ``all_to_all_single`` takes its split sizes as Python lists, so each call reads the
counts to the host exactly once (one ``.tolist()``: the local dispatcher's per-expert counts, the
ep dispatcher's sent and received counts concatenated). Everything else stays on the device.

Autograd: the row all-to-alls are
``torch.distributed._functional_collectives.all_to_all_single_autograd`` (its backward is the
reverse all-to-all with the splits swapped; the CPU tests prove it with uneven and empty splits on
gloo; NCCL runs the same op).
``torch.distributed.nn.functional.all_to_all_single`` works too but is deprecated in favour of the
functional collectives. Gradients reach ``x``, ``top_k_weight`` and, through ``compute``, the
expert weights. Every rank of the ep group must call the dispatcher (and run its backward) the
same number of times, including ranks with no token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

ExpertCompute = Callable[[torch.Tensor, list[int]], torch.Tensor]
"""``compute(x_sorted [M, H], counts_local) -> y_sorted [M, H]``: this rank's local experts."""


def validate_expert_parallel(n_experts: int, ep: int, *, dp: int | None = None) -> int:
    """Check an expert-parallel layout and return the number of experts per ep rank.

    ``dp``, when given, is the number of data-parallel ranks that the ep group is borrowed from:
    ``ep`` must divide it.
    """
    if not isinstance(n_experts, int) or isinstance(n_experts, bool) or n_experts < 1:
        raise EngineError(f"n_experts must be an integer >= 1, got {n_experts!r}")
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise EngineError(f"expert parallel size ep must be an integer >= 1, got {ep!r}")
    if n_experts % ep != 0:
        raise EngineError(
            f"n_experts = {n_experts} is not divisible by the expert parallel size ep = {ep}; "
            f"choose an ep that divides n_experts"
        )
    if dp is not None and dp % ep != 0:
        raise EngineError(
            f"the expert parallel size ep = {ep} does not divide the data-parallel size dp = {dp} "
            f"that the ep group is borrowed from; choose an ep that divides dp"
        )
    return n_experts // ep


def local_expert_range(n_experts: int, ep: int, ep_rank: int) -> range:
    """The global ids of the experts that ep rank ``ep_rank`` holds."""
    per_rank = validate_expert_parallel(n_experts, ep)
    if not 0 <= ep_rank < ep:
        raise EngineError(f"ep_rank must be in [0, {ep}), got {ep_rank}")
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


def check_dispatch_inputs(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weight: torch.Tensor) -> None:
    if x.dim() != 2:
        raise EngineError(f"x must be [N, H], got shape {tuple(x.shape)}")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != x.shape[0]:
        raise EngineError(f"top_k_index must be [N, k] with N = {x.shape[0]}, got shape {tuple(top_k_index.shape)}")
    if top_k_index.dtype != torch.long:
        raise EngineError(f"top_k_index must be torch.long, got {top_k_index.dtype}")
    if top_k_weight.shape != top_k_index.shape:
        raise EngineError(
            f"top_k_weight shape {tuple(top_k_weight.shape)} differs from top_k_index shape {tuple(top_k_index.shape)}"
        )


def check_expert_output(y: torch.Tensor, x_sorted: torch.Tensor) -> None:
    if y.shape != x_sorted.shape:
        raise EngineError(f"expert compute returned shape {tuple(y.shape)} for input shape {tuple(x_sorted.shape)}")


def _permute(
    x: torch.Tensor, top_k_index: torch.Tensor, n_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``x`` repeated per (token, expert) pair and sorted by expert (stable: token order
    within an expert), the sorting order, and the per-expert counts (on the device, no host read)."""
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    x_perm = x.index_select(0, order // top_k_index.shape[1])
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    return x_perm, order, counts


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def _combine(y_perm: torch.Tensor, order: torch.Tensor, top_k_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo :func:`_permute`, weight each pair by its routing weight and sum over ``k``."""
    n_tokens, k = top_k_weight.shape
    y = y_perm.index_select(0, _inverse(order)).view(n_tokens, k, y_perm.shape[-1])
    return (y * top_k_weight.to(dtype).unsqueeze(-1)).sum(dim=1)


class ExpertParallelDispatcher:
    """Experts split evenly over ``ep_group``; tokens travel to their experts' ranks and back."""

    def __init__(self, ep_group: ProcessGroup) -> None:
        import torch.distributed as dist

        self.group = ep_group
        self.ep = dist.get_world_size(ep_group)
        self.ep_rank = dist.get_rank(ep_group)

    def local_experts(self, n_experts: int) -> range:
        """The global ids of the experts this rank holds."""
        return local_expert_range(n_experts, self.ep, self.ep_rank)

    def __call__(
        self,
        x: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weight: torch.Tensor,
        n_experts: int,
        compute: ExpertCompute,
    ) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        check_dispatch_inputs(x, top_k_index, top_k_weight)
        ep, n_local = self.ep, validate_expert_parallel(n_experts, self.ep)
        x_perm, order, counts = _permute(x, top_k_index, n_experts)

        # counts_recv[s * n_local + e]: rows that source rank s sends to local expert e of this rank
        counts_recv = torch.empty_like(counts)
        dist.all_to_all_single(counts_recv, counts, group=self.group)
        host: list[int] = torch.cat([counts, counts_recv]).tolist()  # the one host read of this call
        sent, received = host[:n_experts], host[n_experts:]
        input_splits = [sum(sent[r * n_local : (r + 1) * n_local]) for r in range(ep)]
        output_splits = [sum(received[s * n_local : (s + 1) * n_local]) for s in range(ep)]
        counts_local = [sum(received[s * n_local + e] for s in range(ep)) for e in range(n_local)]
        n_received = sum(output_splits)

        x_recv = all_to_all_single_autograd(x_perm, output_splits, input_splits, self.group)
        # received rows are grouped by source rank, then local expert: regroup by local expert
        expert_of_row = torch.arange(n_local, device=x.device).repeat(ep)
        expert_of_row = expert_of_row.repeat_interleave(counts_recv, output_size=n_received)
        regroup = torch.argsort(expert_of_row, stable=True)
        x_sorted = x_recv.index_select(0, regroup)

        y_sorted = compute(x_sorted, counts_local)
        check_expert_output(y_sorted, x_sorted)

        y_recv = y_sorted.index_select(0, _inverse(regroup))
        y_perm = all_to_all_single_autograd(y_recv, input_splits, output_splits, self.group)
        return _combine(y_perm, order, top_k_weight, x.dtype)
