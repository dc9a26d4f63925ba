"""The narrow interface every train engine (FSDP2, Megatron, Archon) implements.

The engine owns the model shards, the optimizer and the LR schedule on one rank; it knows nothing
about PPO or GRPO. An algorithm hands it a packed batch (:mod:`areal_tasks.api.batch`) and a loss
function; the engine splits the batch into micro-batches, runs forward/backward, normalises the loss
so that the result does not depend on how the batch was split, clips the global gradient norm and
steps the optimizer.

Loss contract::

    loss, stats = loss_fn(outputs, mb)
    weight = loss_weight_fn(mb)

``outputs`` holds ``"logprobs"`` ``[T_mb]`` (differentiable, aligned as in ``api/batch.py``),
``"entropy"`` ``[T_mb]`` and, for a critic, ``"values"`` ``[T_mb]``; ``mb`` is the packed micro-batch
dict. ``loss`` is a mean over the micro-batch's own units (tokens, sequences...) and ``weight``
counts those units. The engine backpropagates ``loss * weight / total_weight`` where
``total_weight`` sums the weights of all micro-batches on all data-parallel ranks, so 1 vs 4
micro-batches and dp=1 vs dp=2 give the same gradients.

Data-parallel contract: ``batch`` is the share of this rank's data-parallel group; ranks that differ
only in their tensor- or sequence-parallel coordinate must pass the same batch.

This module is torch-free at import (torch types only under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

#: a packed batch / micro-batch: key -> tensor (see ``areal_tasks.api.batch``).
Batch = dict[str, "torch.Tensor"]
#: what a loss function returns next to its loss: name -> scalar (float or 0-dim tensor).
LossStats = Mapping[str, Union[float, "torch.Tensor"]]
#: ``loss, stats = loss_fn(outputs, mb)``.
LossFn = Callable[[dict[str, "torch.Tensor"], Batch], tuple["torch.Tensor", LossStats]]
#: ``weight = loss_weight_fn(mb)``: how many units the micro-batch's mean loss averages over.
LossWeightFn = Callable[[Batch], Union[float, int, "torch.Tensor"]]
#: ``hf`` = HuggingFace safetensors (export / inference); ``dcp`` = sharded resumable checkpoint.
SaveFormat = Literal["hf", "dcp"]
#: what ``train_batch`` / ``eval_batch`` return: ``loss``, ``grad_norm``, ``lr``, ``n_tokens`` + loss stats.
TrainStats = dict[str, float]


class SubmittedStep(abc.ABC):
    """An optimizer step that :meth:`TrainEngine.submit_train_batch` queued: its stats are read back
    by :meth:`result`. Read the steps in the order they were submitted, on every rank (the read can
    be a data-parallel collective)."""

    @abc.abstractmethod
    def result(self) -> TrainStats:
        """The step's stats, as :meth:`TrainEngine.train_batch` returns them (waits for the device;
        later calls return the same values)."""


class CompletedStep(SubmittedStep):
    """A step whose stats are already on the host (engines that cannot queue a step)."""

    def __init__(self, stats: TrainStats) -> None:
        self._stats = dict(stats)

    def result(self) -> TrainStats:
        return dict(self._stats)


@dataclass(frozen=True)
class ParallelInfo:
    """Where this rank sits in the engine's device mesh."""

    world_size: int
    rank: int
    dp_size: int
    dp_rank: int
    tp_size: int = 1
    tp_rank: int = 0
    sp_size: int = 1
    sp_rank: int = 0

    @property
    def is_dp_head(self) -> bool:
        """Whether this rank is the first of its data-parallel group (tp_rank == sp_rank == 0)."""
        return self.tp_rank == 0 and self.sp_rank == 0


class TrainEngine(abc.ABC):
    """One rank of a distributed train engine. Call :meth:`initialize` before anything else."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Join the process group, build the device mesh, load and shard the model, build the optimizer."""

    @property
    @abc.abstractmethod
    def parallel(self) -> ParallelInfo:
        """This rank's coordinates in the device mesh."""

    @abc.abstractmethod
    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        """Forward/backward over all micro-batches, clip the global grad norm, step the optimizer.

        Returns ``loss`` and every loss stat averaged with the loss weights over all micro-batches and
        data-parallel ranks, ``grad_norm`` (before clipping), ``lr`` (used for this step) and
        ``n_tokens`` (summed over data-parallel ranks). Does not step the LR schedule.
        """

    def submit_train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> SubmittedStep:
        """:meth:`train_batch` without waiting for its stats: the step's work is queued and
        :meth:`SubmittedStep.result` reads them back. A loop that reads step ``k``'s stats after
        submitting step ``k + 1`` lets the host prepare the next step while the device still runs
        this one. The default runs :meth:`train_batch` at once."""
        return CompletedStep(self.train_batch(batch, loss_fn, loss_weight_fn))

    @abc.abstractmethod
    def eval_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        """The weighted loss and stats of ``batch`` without gradients or an optimizer step."""

    @abc.abstractmethod
    def forward_batch(self, batch: Batch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Per-token outputs ``[T]`` of ``batch`` in its original order, without gradients.

        An actor returns ``logprobs`` (plus ``entropy`` when asked); a critic returns ``values``.
        """

    @abc.abstractmethod
    def step_lr_scheduler(self) -> float:
        """Advance the LR schedule by one step; return the new learning rate."""

    @abc.abstractmethod
    def save(self, path: str, format: SaveFormat = "hf", *, with_optimizer: bool = True) -> None:
        """Write the model (``hf``: full weights, rank 0 writes) or the full train state (``dcp``)."""

    @abc.abstractmethod
    def load(self, path: str, format: SaveFormat = "dcp", *, with_optimizer: bool = True) -> None:
        """Read what :meth:`save` wrote (``hf``: weights only; ``dcp``: full train state)."""

    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta) -> None:
        """Publish the current weights to the inference servers as ``meta`` says (disk, collective,
        or shared: packed into this host's shared buffers, which the servers then copy from)."""

    def shared_weight_buffers(self) -> tuple[dict[str, Any], ...]:
        """The JSON descriptions of the buffers a shared update packed into (one per rank that holds
        one), for :meth:`WeightUpdateMeta.with_buffers`. The default has none: an engine that
        supports shared updates overrides it."""
        from areal_tasks.errors import EngineError

        raise EngineError(
            f"{type(self).__name__} does not support shared weight updates; "
            "use rollout.weight_update=disk or collective"
        )

    def prepare_weight_update(self, meta: WeightUpdateMeta) -> float:
        """Optionally do the part of :meth:`update_weights` that needs no server (gather and pack
        the weights) before the servers pause; returns the seconds it took. Every rank calls it
        right before :meth:`update_weights` with the same ``meta``. The default does nothing."""
        del meta
        return 0.0

    @abc.abstractmethod
    def weight_specs(self) -> list[ParamSpec]:
        """Name, dtype and full shape of every tensor :meth:`update_weights` publishes, in its order.

        The controller plans a collective update's buckets from them
        (``plan_weight_buckets(engine.weight_specs(), meta.bucket_bytes)``) for the inference
        client, while the engine broadcasts the same buckets. Local: no collective.
        """

    @abc.abstractmethod
    def get_version(self) -> int:
        """The policy version of the current weights."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Set the policy version (the trainer bumps it after each published update)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the model, optimizer and the weight-update groups this engine joined."""
