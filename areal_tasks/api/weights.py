"""What a train engine offers a weight transport: the :class:`WeightSource` protocol.

A weight transport (``areal_tasks.weights``: disk, collective, shared memory) publishes an
engine's current weights to the inference servers. It needs only this much of the engine, so any
engine that offers it can be published by every transport, and no transport knows an engine:

* :meth:`WeightSource.weight_specs`: name, dtype and full shape of every tensor the servers get,
  in the order :meth:`WeightSource.iter_weights` yields them, floating-point tensors in the
  *publish dtype* (the engine's compute dtype: the servers run it, and the fp32 of master weights
  would double the bytes). Local, no collective; the list never changes during a run.
* :meth:`WeightSource.iter_weights`: the full (unsharded) HF-named tensors, in that order. A
  collective over the engine's ranks: every rank iterates to the end, in step; the transport uses
  the tensors on rank 0 only. A floating-point tensor may still be in another floating-point
  dtype (e.g. an fp32 master weight): the transport casts it to its spec's dtype while copying it
  where it goes (no extra copy).
* :attr:`WeightSource.device`: where those tensors are (a shared buffer is made there).
* :meth:`WeightSource.hf_config` and :attr:`WeightSource.model_path`: what a disk update writes
  next to the tensors (``config.json``; tokenizer and other side files of the source directory).
* :attr:`WeightSource.parallel`: the engine's ranks (rank 0 writes, broadcasts or holds the buffer).

Torch-free at import. :class:`~areal_tasks.api.weight_update.WeightUpdateMeta` stays the wire type
the servers are sent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.train_engine import ParallelInfo

logger = logging.getLogger(__name__)

__all__ = ["WeightSource"]


@runtime_checkable
class WeightSource(Protocol):
    """An engine whose weights a transport can publish (see the module doc)."""

    @property
    def parallel(self) -> ParallelInfo:
        """This rank's place among the engine's ranks (``rank == 0`` sends)."""
        ...

    @property
    def device(self) -> torch.device:
        """The device :meth:`iter_weights` yields tensors on."""
        ...

    @property
    def model_path(self) -> str | None:
        """The HF directory the model came from (tokenizer and side files), or None."""
        ...

    def weight_specs(self) -> list[ParamSpec]:
        """Name, publish dtype and full shape of every published tensor, in :meth:`iter_weights` order."""
        ...

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full HF-named tensors (a collective: every rank iterates to the end; rank 0 uses them)."""
        ...

    def hf_config(self) -> Any:
        """The ``transformers`` config a disk update writes as ``config.json``."""
        ...
