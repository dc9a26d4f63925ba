"""The weight-transport contract: one class per mode, holding both ends of a weight update.

A :class:`WeightTransport` publishes a :class:`~areal_tasks.api.weights.WeightSource` (a train
engine) to the inference servers. One instance per run, built once from ``rollout.weight_update``
(:mod:`areal_tasks.weights.registry`), owns whatever the mode keeps between updates (a joined
group, a shared buffer, bytes packed ahead). One update, as the trainer's publisher runs it::

    meta = transport.plan(version)      # every rank: the update (a collective, for a group's port)
    parts = transport.prepare(meta)     # every rank, servers still generating: write, gather, pack
    transport.send(meta)                # every rank: before the pause, or while the servers load
                                        #   (sends_while_paused: the collective broadcast)
    meta, buckets = transport.server_update(meta)  # rank 0: what every server is sent
    ...                                 # rank 0: pause, load, resume (the inference client)
    transport.retire(meta)              # rank 0, after the resume (disk: old directories go)
    transport.close()                   # every rank, at the end (leave groups, drop buffers)

The receiving side is the transport's :class:`WeightReceiver` (:meth:`WeightTransport.receiver`):
what a server does with one load (:class:`WeightLoad`): read and check a safetensors directory,
receive a bucket over the group, or read the shared buffer. It returns the new tensors staged,
checked against the served model (:class:`ServedWeights`) when one is given, so a server copies
them in between two decode steps or not at all. Given the served model, a receiver hands tensors
over in its names: per-expert MoE tensors (as the archon engine publishes them) come out stacked
as the served module holds them (:mod:`areal_tasks.weights.expert_fold`); without it (vLLM), as
they came. An update of several loads (a collective one's buckets) ends with
:meth:`WeightReceiver.finish_update`. The embedded server and the vLLM plugin use
these receivers; nothing on the server side imports an engine.

Torch is imported inside functions: the module imports without it.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from areal_tasks.errors import WeightTransportError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.api.weights import WeightSource
    from areal_tasks.config.allocation import AllocationMode
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "PublishContext",
    "ServedWeights",
    "WeightLoad",
    "WeightReceiver",
    "WeightTransport",
    "all_gather_objects",
    "broadcast_int",
    "check_tensors",
    "on_device",
    "rank_barrier",
]

#: served name -> (shape, dtype) of every tensor a weight update may replace.
SpecMap = Mapping[str, tuple[tuple[int, ...], "torch.dtype"]]


@dataclass(frozen=True)
class PublishContext:
    """What the trainer side of a transport needs besides the engine."""

    #: where disk updates are written, one ``v<version>`` directory each (the run's ``weights/``).
    weights_dir: Path
    #: inference servers the updates go to (rank 0 knows; every rank agrees on rank 0's number).
    n_servers: int = 0


@dataclass(frozen=True)
class WeightLoad:
    """One load a server is asked for, as it arrives (torch-free; the lists are untrusted).

    ``path``: a safetensors directory (disk). ``group_name``: the joined group a bucket arrives
    over (collective). ``shared_buffers``: the trainer's buffer descriptions (shared). ``names``,
    ``dtypes``, ``shapes``: the tensors of the bucket or buffer, back to back in this order.
    """

    path: str | None = None
    group_name: str | None = None
    shared_buffers: tuple[Mapping[str, Any], ...] = ()
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    #: collective: ``flattened_bucket`` (one ``uint8`` broadcast) or None/``auto`` (one per tensor).
    load_format: str | None = "flattened_bucket"

    @classmethod
    def of(cls, meta: WeightUpdateMeta, bucket: Sequence[ParamSpec] | None = None) -> WeightLoad:
        """The load a server gets for ``meta`` (and one ``bucket`` of its plan, or the shared layout)."""
        return cls.for_specs(
            bucket or (), path=meta.path, group_name=meta.group_name, shared_buffers=tuple(meta.shared_buffers)
        )

    @classmethod
    def for_specs(cls, specs: Sequence[ParamSpec], **fields: Any) -> WeightLoad:
        """A load of ``specs``' tensors back to back (their names, dtypes and shapes), plus ``fields``."""
        return cls(
            names=[s.name for s in specs],
            dtypes=[s.dtype for s in specs],
            shapes=[list(s.shape) for s in specs],
            **fields,
        )


def check_tensors(named: Mapping[str, torch.Tensor], specs: SpecMap, required: set[str] | None) -> None:
    """Raise :class:`WeightTransportError` unless every tensor matches a served weight by name and
    shape (and, with ``required``, every required name is present)."""
    unknown = sorted(set(named) - set(specs))
    if unknown:
        raise WeightTransportError(f"weights {unknown[:5]} (of {len(unknown)}) are not in the served model")
    wrong = [f"{n}: {tuple(t.shape)} != {specs[n][0]}" for n, t in named.items() if tuple(t.shape) != specs[n][0]]
    if wrong:
        raise WeightTransportError(f"shape mismatch: {wrong[:5]}")
    if required is not None:
        missing = sorted(required - set(named))
        if missing:
            raise WeightTransportError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")


@dataclass(frozen=True)
class ServedWeights:
    """The served model, as a receiver checks an update against it."""

    #: name -> (shape, dtype) of every tensor an update may replace.
    specs: SpecMap
    #: the names a complete update must carry (a tied alias once); None: no completeness check.
    required: set[str] | None = None

    def check(self, named: Mapping[str, torch.Tensor], *, complete: bool) -> None:
        """:func:`check_tensors`; ``complete``: the update must carry every required weight."""
        check_tensors(named, self.specs, self.required if complete else None)


class WeightReceiver(ABC):
    """A server's end of one transport (see the module doc); one per server process."""

    def open(self, meta: WeightUpdateMeta, rank: int) -> None:  # noqa: B027 - optional hook
        """Get ready to receive ``meta``'s updates as server rank ``rank`` (``1 + i * ranks per
        server`` for the client's server ``i``): the collective transport joins the group, once.
        Default: nothing (a disk or shared load needs no setup)."""

    @abstractmethod
    def receive(self, load: WeightLoad, served: ServedWeights | None = None) -> dict[str, torch.Tensor]:
        """The tensors of ``load`` on this receiver's device, staged; checked against ``served``
        when given (names and shapes; a disk or shared load must also be complete). Raises
        :class:`WeightTransportError` naming what does not fit; nothing is applied here."""

    def finish_update(self) -> None:  # noqa: B027 - optional hook; one-load receivers keep the default
        """The last load of an update was received: raise :class:`WeightTransportError` when the
        loads did not make a whole update (a collective one's buckets that left a MoE layer's
        experts incomplete), and forget the update either way. Default: nothing (a disk or shared
        load is a whole update, checked by :meth:`receive`)."""

    def close(self) -> None:  # noqa: B027 - optional hook; receivers without state keep the default
        """Release what the receiver holds (groups, mappings). Default: nothing."""


class WeightTransport(ABC):
    """The trainer's (and controller's) end of one mode; see the module doc for the sequence."""

    #: the registry name (``rollout.weight_update``).
    name: ClassVar[str]
    #: whether :meth:`send` must run while the servers load (a broadcast they receive), not before the pause.
    sends_while_paused: ClassVar[bool] = False
    #: whether the trainer keeps a copy of the published weights for the run (a memory budget counts it).
    keeps_publish_buffer: ClassVar[bool] = False

    def __init__(self, source: WeightSource, context: PublishContext) -> None:
        self.source = source
        self.context = context

    @property
    def is_sender(self) -> bool:
        """Whether this rank writes, broadcasts or talks to the servers (the engine's rank 0)."""
        return self.source.parallel.rank == 0

    @abstractmethod
    def plan(self, version: int) -> WeightUpdateMeta:
        """The update that publishes ``version``; every rank calls it (it may be a collective)."""

    def prepare(self, meta: WeightUpdateMeta) -> dict[str, float]:
        """Work that needs no server, done while the servers still generate (every rank); returns
        timings (``perf/...`` seconds). Default: nothing."""
        del meta
        return {}

    @abstractmethod
    def send(self, meta: WeightUpdateMeta) -> None:
        """Publish the weights as ``meta`` says (every rank; the engine's gathers are collectives)."""

    @abstractmethod
    def server_update(self, meta: WeightUpdateMeta) -> tuple[WeightUpdateMeta, list[list[ParamSpec]] | None]:
        """Rank 0: the meta every server is sent and the bucket plan it loads (None: no plan)."""

    def retire(self, meta: WeightUpdateMeta) -> None:  # noqa: B027 - optional hook
        """Rank 0, after the servers resumed on ``meta``: drop what older updates left. Default: nothing."""

    @property
    def servers_must_leave(self) -> bool:
        """Whether :meth:`close` must run while every server leaves a group (the client's
        ``destroy_weight_groups``): with NCCL both ends must be in the teardown together."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release groups and buffers (every rank; idempotent; bounded). Default: nothing."""

    @classmethod
    @abstractmethod
    def receiver(cls, device: torch.device) -> WeightReceiver:
        """A server's receiving end of this mode, staging tensors on ``device``."""

    @classmethod
    def placement_problems(cls, cfg: JobConfig, alloc: AllocationMode) -> list[tuple[str, str]]:
        """``(field, problem)`` for every way ``cfg``'s placement (backend, GPUs, nodes) rules this
        mode out, checked before anything starts. Default: none."""
        del cfg, alloc
        return []


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` current in this thread (new threads start on cuda:0); a no-op on CPU."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def rank_barrier() -> None:
    """Wait for every rank of the default group (nothing to wait for in a world of one)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_int(value: int) -> int:
    """Rank 0's ``value`` on every rank of the default group."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return int(value)
    box = [int(value) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])  # type: ignore[arg-type]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` of the default group, in rank order (``[obj]`` in a world of one)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
