"""The train-engine protocols, split by role, and ``TrainEngine``, the full engine (FSDP2 today).

The engine owns the model shards, the optimizer and the LR schedule on one rank; it knows nothing
about PPO or GRPO. Its consumers each see one narrow role:

* :class:`EngineLifecycle`: ``initialize``/``destroy`` and the policy version (the loop);
* :class:`ForwardEngine`: where the rank sits (``parallel``) and per-token outputs without
  gradients (``forward_batch``: log-probs of an actor or a reference, values of a critic);
* :class:`TrainableEngine`: optimizer steps on a packed batch and a loss, the LR schedule, the HF
  save (the RL step, the SFT loop);
* :class:`CheckpointableEngine`: what ``checkpoint/`` saves and restores, as methods (the sharded
  state DCP writes, a small JSON of engine facts, the HF sidecar files).

Publishing weights to inference servers is not an engine role here: the weight transports take what
the engine offers them (``api/weights.py``). Engines are built by name through
``areal_tasks.engine.registry``.

An algorithm hands the engine a packed batch (:mod:`areal_tasks.api.batch`) and a loss function; the
engine splits the batch into micro-batches, runs forward/backward, normalises the loss so that the
result does not depend on how the batch was split, clips the global gradient norm and steps the
optimizer.

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
only in their tensor-, sequence- or pipeline-parallel coordinate must pass the same batch, and get
the same outputs and stats back (a pipeline engine hands the last stage's results to every stage).

This module is torch-free at import (torch types only under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union, runtime_checkable

if TYPE_CHECKING:
    import torch

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
    """An optimizer step that :meth:`TrainableEngine.submit_train_batch` queued: its stats are read back
    by :meth:`result`. Read the steps in the order they were submitted, on every rank (the read can
    be a data-parallel collective)."""

    @abc.abstractmethod
    def result(self) -> TrainStats:
        """The step's stats, as :meth:`TrainableEngine.train_batch` returns them (waits for the device;
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
    pp_size: int = 1
    pp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0

    @property
    def is_dp_head(self) -> bool:
        """Whether this rank speaks for its data-parallel share: the first of the ranks that hold the
        same share (tp_rank == sp_rank == pp_rank == 0). Expert parallelism splits no batch."""
        return self.tp_rank == 0 and self.sp_rank == 0 and self.pp_rank == 0


@runtime_checkable
class EngineLifecycle(Protocol):
    """Building and releasing an engine, and the policy version of its weights."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Join the process group, build the device mesh, load (and shard) the model, build the optimizer."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the model, the optimizer and any group the engine joined."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The policy version of the current weights."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Set the policy version (the trainer bumps it after each published update)."""


@runtime_checkable
class ForwardEngine(Protocol):
    """Per-token outputs of a packed batch without gradients: what a reference model or a critic's
    value forward is used for. (``isinstance`` reads ``parallel``: check initialised engines.)"""

    @property
    @abc.abstractmethod
    def parallel(self) -> ParallelInfo:
        """This rank's coordinates in the device mesh."""

    @abc.abstractmethod
    def forward_batch(self, batch: Batch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Per-token outputs ``[T]`` of ``batch`` in its original order, without gradients.

        An actor returns ``logprobs`` (plus ``entropy`` when asked); a critic returns ``values``.
        """


@runtime_checkable
class TrainableEngine(ForwardEngine, Protocol):
    """Optimizer steps on packed batches with a loss function, the LR schedule and the HF save."""

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
    def step_lr_scheduler(self) -> float:
        """Advance the LR schedule by one step; return the new learning rate."""

    @abc.abstractmethod
    def save(self, path: str, format: SaveFormat = "hf", *, with_optimizer: bool = True) -> None:
        """Write the model (``hf``: full weights, an HF directory plain ``transformers`` loads; rank 0
        writes) or the engine's own resumable state (``dcp``, optional: the checkpoint manager goes
        through :class:`CheckpointableEngine` instead)."""

    @abc.abstractmethod
    def load(self, path: str, format: SaveFormat = "dcp", *, with_optimizer: bool = True) -> None:
        """Read what :meth:`save` wrote (``hf``: weights only; ``dcp``: the engine's train state)."""


@runtime_checkable
class CheckpointableEngine(Protocol):
    """What ``checkpoint/`` needs from an engine: its sharded state for DCP, a small JSON of engine
    facts, and the HF sidecar files. Saves and loads are collective: every rank calls them.

    The checkpoint manager saves ``sharded_state()`` with DCP; to load, it asks for
    ``sharded_state()`` again as the template DCP reads into (in place), then hands the filled
    template to :meth:`load_sharded_state`, then the JSON facts to :meth:`load_engine_state`.
    """

    @abc.abstractmethod
    def sharded_state(self) -> dict[str, Any]:
        """A nested dict of tensors DCP can save and load into (this rank's shards, no gather), e.g.
        ``{"model": ..., "optim": ...}``: live references, so the caller copies what it must keep.
        Taking it changes nothing (an optimizer that has not stepped yet stays that way)."""

    @abc.abstractmethod
    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Apply a :meth:`sharded_state` template that DCP filled from a checkpoint."""

    @abc.abstractmethod
    def engine_state(self) -> dict[str, Any]:
        """JSON facts of the engine: at least ``version``, ``lr_scheduler`` (its ``state_dict`` or
        None), ``role`` (``actor``/``critic``), ``lora`` and ``lora_scalings`` (module -> scaling),
        ``tied_embeddings``, ``model_type``, ``has_optimizer`` and ``optimizer_started``. The HF
        export reads ``role``, ``lora``, ``lora_scalings`` and ``tied_embeddings``."""

    @abc.abstractmethod
    def load_engine_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`engine_state` returned (version, LR schedule, an optimizer saved
        before its first step). Called after :meth:`load_sharded_state`."""

    @abc.abstractmethod
    def hf_sidecar_files(self) -> dict[str, bytes]:
        """``{file name: bytes}`` a checkpoint keeps to export the model to HF without the engine:
        ``config.json`` and the tokenizer files of the model it was built from (empty: no export)."""


class TrainEngine(EngineLifecycle, TrainableEngine, CheckpointableEngine):
    """The full engine of one rank: every role above. Call :meth:`initialize` before anything else.

    A backend subclasses it and registers in ``areal_tasks.engine.registry``; consumers type against
    the narrowest role they use."""
