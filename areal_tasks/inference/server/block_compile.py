"""Whole decoder blocks through ``torch.compile`` for the captured decode steps (the default on CUDA).

The per-module compile (``models/compile.py``) fuses the norms and the MLP's element-wise work;
the attention around them would still run eagerly: the q/k/v reshapes, the rotary embedding (a
``rotate_half`` alone is two slices, a negation and a concatenation) and the residual adds, about
twenty small kernels per block that each take a few microseconds at decode sizes. Compiling each
whole block forward fuses them with the norms around them, and the block's input projections run
as one GEMM per group (``fused_projections.py``).

What keeps this fast and to one set of compiled graphs for every block:

- the cache write is not traced (``cuda_graph.write_at_positions`` is excluded): a compiled graph
  turns an in-place write into one of its inputs into a functional copy of the whole store and a
  copy back, every block and step. This was why a first version (without the exclusion) made the
  decode forward slower than compiling only the norms and MLPs (docs/benchmarks_history.md,
  "Inference throughput (H200)", first session). Each block therefore compiles as two graphs, before
  and after the write;
- the cache view does not look its storage up by ``layer_idx`` inside the compiled code: a plain
  Python wrapper outside it hands the view the block's storage first
  (:meth:`~areal_tasks.inference.server.cuda_graph.StaticCacheView.use_layer`), and the module's
  integer ``layer_idx`` is traced as a symbol rather than a constant
  (``allow_unspec_int_on_nn_module``, in :func:`~areal_tasks.models.compile.compile_block_forward`),
  so the blocks do not recompile one by one until the recompile limit sends the later ones back to
  eager;
- ``dynamic=True``: one graph serves every batch-size bucket (batch 1 and each KV-length bucket
  still specialise: a few graphs in all, compiled while the decode steps are captured).

A CUDA-graph step runs Python only while it is captured, so the compiled forwards are swapped in
for the capture alone (:meth:`CompiledBlocks.active`); prefill and eager decode keep the blocks'
own forwards.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from areal_tasks.inference.server.fused_projections import FusedGroup, fuse_input_projections
from areal_tasks.models.compile import compile_block_forward

logger = logging.getLogger(__name__)


class LayerSelectingCache(Protocol):
    """A cache view that is told which block's storage the next ``update`` writes."""

    def use_layer(self, layer: int) -> None: ...


class CompiledBlocks:
    """Compiled forwards of a model's decoder blocks, used only inside :meth:`active`."""

    def __init__(self, blocks: list[torch.nn.Module]) -> None:
        self.blocks = blocks
        self._compiled = [compile_block_forward(block) for block in blocks]
        #: the blocks' fused input projections (their parameters become views of the fused weights).
        self.fused: list[FusedGroup] = fuse_input_projections(blocks)
        if self.fused:
            logger.info("decode blocks: %d projection groups fused (q/k/v, gate/up)", len(self.fused))

    def _forward(self, layer: int, view: LayerSelectingCache) -> Callable[..., Any]:
        compiled = self._compiled[layer]

        def forward(*args: Any, **kwargs: Any) -> Any:
            view.use_layer(layer)  # outside the compiled code: see the module doc
            return compiled(*args, **kwargs)

        return forward

    @contextlib.contextmanager
    def active(self, view: LayerSelectingCache) -> Iterator[None]:
        """Inside the context every block runs its compiled forward over ``view`` with its
        projections fused; the blocks' own forwards come back on exit, also after an error."""
        with contextlib.ExitStack() as stack:
            for group in self.fused:
                stack.enter_context(group.active())
            for layer, block in enumerate(self.blocks):
                block.forward = self._forward(layer, view)
            try:
                yield
            finally:
                for block in self.blocks:
                    block.__dict__.pop("forward", None)
