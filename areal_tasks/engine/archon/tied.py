"""Tied word embeddings across pipeline stages.

A model with ``tie_word_embeddings`` uses one matrix as its embedding (first stage) and its LM head
(last stage). Split into stages, the first and the last stage each hold a copy, initialised equal;
after every backward their gradients are summed between the two ranks (each copy then holds the
gradient of the one shared weight), so AdamW moves both copies identically and they stay equal.
The global gradient norm counts the shared weight once (the head's copy is left out of it), and the
export, the weight updates and the gradients the engine reports name only ``embed_tokens.weight``,
as HF's tied checkpoints do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from areal_tasks.engine.archon.parallel.mesh import ArchonMesh

logger = logging.getLogger(__name__)

__all__ = ["TiedEmbeddings"]


class TiedEmbeddings:
    """The copy of the tied matrix this rank holds (first or last stage) and the two-rank group that
    sums their gradients; build on every rank (group creation is collective)."""

    def __init__(self, mesh: ArchonMesh, parts: list[torch.nn.Module]) -> None:
        import torch.distributed as dist

        dims = mesh.dims
        grid = mesh.mesh.mesh  # [pp, dp, cp, tp] global ranks
        self.group: ProcessGroup | None = None
        me = dist.get_rank()
        for d in range(dims.dp):
            for c in range(dims.sp):
                for t in range(dims.tp):
                    ranks = [int(grid[0, d, c, t]), int(grid[-1, d, c, t])]
                    group = dist.new_group(ranks)
                    if me in ranks:
                        self.group = group
        self.weights = [
            module.weight
            for part in parts
            for module in (part.embed_tokens, part.lm_head)
            if module is not None and getattr(module, "weight", None) is not None
        ]

    def head_copies(self, parts: list[torch.nn.Module]) -> set[torch.nn.Parameter]:
        """The LM head's copies held here (left out of the gradient norm and the reports)."""
        return {part.lm_head.weight for part in parts if part.lm_head is not None and part.embed_tokens is None}

    def sync_grads(self) -> None:
        """Sum the two copies' gradients over the first and last stage (after backward)."""
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for weight in self.weights:
                if weight.grad is not None:
                    grad = weight.grad.to_local() if isinstance(weight.grad, DTensor) else weight.grad
                    dist.all_reduce(grad, group=self.group)
