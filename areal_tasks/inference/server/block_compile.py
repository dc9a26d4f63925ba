"""Whole decoder blocks through ``torch.compile`` for the captured decode steps.

The per-module compile (``models/compile.py``) fuses the norms and the MLP's element-wise work;
a decode step's attention still runs eagerly: the q/k/v reshapes, the rotary embedding (a
``rotate_half`` alone is two slices, a negation and a concatenation), the cache write and the
residual adds, about twenty small kernels per block that each take a few microseconds at decode
sizes. Compiling each whole block forward fuses them with the norms around them.

Two things keep this to one compiled graph for every block rather than one per block:

- the cache view must not look its storage up by ``layer_idx`` inside the compiled code (an
  integer attribute of the module, which ``torch.compile`` treats as a constant, so each block
  would recompile and the recompile limit would send the later ones back to eager). A plain
  Python wrapper outside the compiled code hands the view the block's storage first
  (:meth:`~areal_tasks.inference.server.cuda_graph.StaticCacheView.use_layer`), and the compiled
  code sees only tensors of the same shape;
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
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class LayerSelectingCache(Protocol):
    """A cache view that is told which block's storage the next ``update`` writes."""

    def use_layer(self, layer: int) -> None: ...


class CompiledBlocks:
    """Compiled forwards of a model's decoder blocks, used only inside :meth:`active`."""

    def __init__(self, blocks: list[torch.nn.Module]) -> None:
        import torch

        self.blocks = blocks
        self._compiled = [torch.compile(block.forward, dynamic=True) for block in blocks]

    def _forward(self, layer: int, view: LayerSelectingCache) -> Callable[..., Any]:
        compiled = self._compiled[layer]

        def forward(*args: Any, **kwargs: Any) -> Any:
            view.use_layer(layer)  # outside the compiled code: see the module doc
            return compiled(*args, **kwargs)

        return forward

    @contextlib.contextmanager
    def active(self, view: LayerSelectingCache) -> Iterator[None]:
        """Inside the context every block runs its compiled forward over ``view``; the blocks'
        own forwards come back on exit, also after an error."""
        for layer, block in enumerate(self.blocks):
            block.forward = self._forward(layer, view)
        try:
            yield
        finally:
            for block in self.blocks:
                block.__dict__.pop("forward", None)
