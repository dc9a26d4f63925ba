"""Shared-memory weight updates, for servers on the trainer's host (colocated).

When the inference servers run on the trainer's own GPUs NCCL cannot connect them, and a disk
update costs a write and a read of the whole model. Here every trainer rank that holds a buffer
(each GPU rank one on its GPU; on CPU rank 0 one file) keeps it for the run
(:mod:`.shared_buffer`) and packs each update into it before the servers pause; paused, each server
copies the weights out of the buffer on its own device.

* **Trainer** (:class:`SharedTransport`): the first pack makes the buffers and the ranks exchange
  their descriptions once (``all_gather_object``); :meth:`SharedTransport.prepare` gathers and
  packs (timed as ``perf/weight_pack_s``), :meth:`SharedTransport.send` only waits for the ranks.
  The servers are sent the descriptions and the buffer's layout as one "bucket".
* **Server** (:class:`SharedReceiver`): opens the buffer on its device once and keeps the mapping
  while the trainer names the same buffer; the views of one layout are made once and checked
  against the served model the first time (slicing 291 tensors anew cost more than the copy).
  Per-expert MoE tensors (the archon engine's names) are stacked into the served model's expert
  weights on every read (:mod:`.expert_fold`): a copy of the experts, as the buffer's views cannot
  be stacked in place.
* **Where it works**: only the embedded server reads buffers; :meth:`SharedTransport.placement_problems`
  refuses other backends, GPU servers that are not colocated with the actor, and multi-node CPU jobs.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import WeightTransportError
from areal_tasks.weights.base import (
    PublishContext,
    ServedWeights,
    WeightLoad,
    WeightReceiver,
    WeightTransport,
    all_gather_objects,
    on_device,
    rank_barrier,
)
from areal_tasks.weights.buckets import dtype_of, split_flat
from areal_tasks.weights.expert_fold import fold_expert_tensors
from areal_tasks.weights.shared_buffer import SharedWeightBuffer, open_shared_buffer, pick_buffer, shared_layout

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weights import WeightSource
    from areal_tasks.config.allocation import AllocationMode
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["SharedReceiver", "SharedTransport"]


class SharedTransport(WeightTransport):
    """``shared``: the trainer's buffers in memory the servers on its host map."""

    name: ClassVar[str] = "shared"
    keeps_publish_buffer: ClassVar[bool] = True

    def __init__(self, source: WeightSource, context: PublishContext) -> None:
        super().__init__(source, context)
        #: this rank's buffer (None on a CPU rank other than 0), and every rank's description of theirs
        self._buffer: SharedWeightBuffer | None = None
        self._descriptions: tuple[dict[str, Any], ...] = ()
        self._layout: list[ParamSpec] | None = None
        #: the version :meth:`prepare` packed (the next :meth:`send` of it packs nothing)
        self._packed: int | None = None

    @property
    def layout(self) -> list[ParamSpec]:
        """The order the tensors lie in every buffer (the source's specs never change)."""
        if self._layout is None:
            self._layout = shared_layout(self.source.weight_specs())
        return self._layout

    @property
    def descriptions(self) -> tuple[dict[str, Any], ...]:
        """The descriptions of every rank's buffer (made by the first pack)."""
        if not self._descriptions:
            raise WeightTransportError(
                "no shared weight buffer yet: the first prepare or send of a shared update makes them"
            )
        return self._descriptions

    def plan(self, version: int) -> WeightUpdateMeta:
        return WeightUpdateMeta.shared(version)

    def prepare(self, meta: WeightUpdateMeta) -> dict[str, float]:
        """Gather the weights and pack them into the buffers while the servers still generate."""
        started = time.perf_counter()
        self._packed = None
        self._pack()
        self._packed = meta.version
        return {"perf/weight_pack_s": time.perf_counter() - started}

    def send(self, meta: WeightUpdateMeta) -> None:
        """Pack unless :meth:`prepare` packed this version already; then wait for every rank."""
        packed, self._packed = self._packed, None
        if packed != meta.version:
            self._pack()
        rank_barrier()

    def server_update(self, meta: WeightUpdateMeta) -> tuple[WeightUpdateMeta, list[list[ParamSpec]] | None]:
        return meta.with_buffers(self.descriptions), [self.layout]

    def _pack(self) -> None:
        """Gather the weights (every rank) and pack them into this rank's buffer, making the
        buffers on the first call (each GPU rank one on its GPU; on CPU rank 0 one file)."""
        layout = self.layout
        if self._buffer is None and not self._descriptions:
            holds = self.source.device.type == "cuda" or self.is_sender
            buffer = SharedWeightBuffer(sum(spec.nbytes for spec in layout), self.source.device) if holds else None
            descriptions = all_gather_objects(buffer.describe() if buffer is not None else None)
            self._buffer = buffer
            self._descriptions = tuple(d for d in descriptions if d is not None)
        stream = self.source.iter_weights()
        if self._buffer is None:
            collections.deque(stream, maxlen=0)  # take part in every gather
        else:
            self._buffer.pack(layout, stream)

    def close(self) -> None:
        """Drop this rank's buffer (its file, on CPU); servers keep what they mapped."""
        if self._buffer is not None:
            self._buffer.close()
        self._buffer, self._descriptions, self._packed = None, (), None

    @classmethod
    def receiver(cls, device: torch.device) -> SharedReceiver:
        return SharedReceiver(device)

    @classmethod
    def placement_problems(cls, cfg: JobConfig, alloc: AllocationMode) -> list[tuple[str, str]]:
        cluster = cfg.cluster
        if cfg.rollout.backend != "embedded":
            why = (
                f"'shared' needs the embedded inference server; {cfg.rollout.backend!r} "
                "servers cannot read the trainer's buffers: use disk or collective"
            )
        elif cluster.gpus_per_node > 0 and not alloc.actor_shares_inference_gpus():
            why = (
                f"'shared' reads the trainer's buffers on its own GPUs, but in "
                f"{cfg.allocation!r} the servers have GPUs of their own ('+'); colocate them with '|', or set "
                "rollout.weight_update=collective"
            )
        elif cluster.gpus_per_node == 0 and cluster.nodes > 1:
            why = (
                f"'shared' on CPU reads one file on the trainer's host, but "
                f"cluster.nodes is {cluster.nodes}; set rollout.weight_update=disk or collective"
            )
        else:
            return []
        return [("rollout.weight_update", why)]


class SharedReceiver(WeightReceiver):
    """A server's view of the trainer's shared buffer, opened on first use and kept until the
    trainer names another one (a new run, or a trainer that restarted)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._opened: tuple[str, torch.Tensor] | None = None
        self._views: tuple[tuple, dict[str, torch.Tensor]] | None = None

    def read(
        self,
        descriptions: Sequence[Mapping[str, Any]],
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """Views of the listed tensors in the buffer on this server's device (no copy), and
        whether they are new (a buffer or layout not seen before: the caller validates those)."""
        with on_device(self.device):
            description = pick_buffer(descriptions, self.device)
            buffer_id = str(description.get("id"))
            if self._opened is None or self._opened[0] != buffer_id:
                self._opened = self._views = None  # drop the old mapping first
                self._opened = (buffer_id, open_shared_buffer(description))
        key = (buffer_id, tuple(names), tuple(dtypes), tuple(tuple(shape) for shape in shapes))
        if self._views is not None and self._views[0] == key:
            return self._views[1], False
        views = split_flat(self._opened[1], names, [dtype_of(d) for d in dtypes], shapes)
        self._views = (key, views)
        return views, True

    def receive(self, load: WeightLoad, served: ServedWeights | None = None) -> dict[str, torch.Tensor]:
        """Views of the buffer's tensors (the caller copies them in and waits for the copy before
        it answers, so the trainer may pack the next update at once); with ``served``, in its
        names: per-expert MoE tensors come out stacked (fresh tensors,
        :func:`~areal_tasks.weights.expert_fold.fold_expert_tensors`). A buffer or layout seen for
        the first time is checked against ``served``, and must be complete."""
        named, fresh = self.read(load.shared_buffers, load.names, load.dtypes, load.shapes)
        if served is None:
            return named
        try:
            folded = fold_expert_tensors(named, served.specs)
            if fresh:  # the same buffer and layout as the last update: checked then
                served.check(folded, complete=True)
        except WeightTransportError:
            self._views = None  # validate the next read's views again
            raise
        return folded

    def close(self) -> None:
        self._opened = self._views = None
