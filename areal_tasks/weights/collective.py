"""Collective weight updates: trainer rank 0 broadcasts planned buckets to every server rank.

One protocol, SGLang 0.5.23's (``docs/inference.md``, "Collective weight updates"), spoken to
SGLang servers, the embedded server and vLLM (through our plugin) alike:

* **Group.** Trainer rank 0 and every server rank join one process group (:mod:`.group`), once
  per run: the trainer's first broadcast joins while the client makes the servers join
  (``/init_weights_update_group``), and the group stays until :meth:`CollectiveTransport.close`.
* **Buckets.** Both the trainer and the client split the weights with the shared
  :func:`~areal_tasks.api.inference.plan_weight_buckets` over the same :class:`ParamSpec` list (the
  source's ``weight_specs()``), so they agree on every bucket without a header on the wire.
* **Wire.** Per bucket, exactly one ``broadcast(src=0)`` of a ``uint8`` tensor: the bucket's
  tensors' bytes back to back in the bucket's order (:mod:`.buckets`; what a server allocates for
  ``/update_weights_from_distributed`` with ``load_format="flattened_bucket"``). No header, no end
  marker, no version on the wire: the version travels over HTTP (``weight_version``).
* **Ahead of the pause.** When the weights fit in one bucket, :meth:`CollectiveTransport.prepare`
  gathers and packs them while the servers still generate; the paused update is then one
  broadcast. With more buckets nothing is staged (holding every bucket would cost the model's
  bytes again): the broadcast packs bucket by bucket while the servers are paused.
* **Receive.** :class:`CollectiveReceiver` is a server's end: it joins groups by name and receives
  a bucket (one flattened broadcast, or one broadcast per tensor) into fresh tensors. For the
  embedded server (a served model given) a bucket may hold only some experts of a MoE layer in
  their per-expert names: the receiver keeps them until the layer is complete, hands them over
  stacked as the served model holds them, and refuses an update that ends with a layer incomplete
  (:mod:`.expert_fold`).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import WeightTransportError
from areal_tasks.weights.base import (
    PublishContext,
    ServedWeights,
    WeightLoad,
    WeightReceiver,
    WeightTransport,
    broadcast_int,
    on_device,
    rank_barrier,
)
from areal_tasks.weights.buckets import dtype_of, flat_bytes, flatten_bucket, split_flat
from areal_tasks.weights.expert_fold import ExpertFold
from areal_tasks.weights.group import WeightGroup, join_as_server, join_as_trainer

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.weights import WeightSource
    from areal_tasks.config.allocation import AllocationMode
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["BucketedBroadcastSender", "CollectiveReceiver", "CollectiveTransport", "receive_bucket"]


class BucketedBroadcastSender:
    """Rank 0: sends named tensors as the planned buckets of one update (see the module doc)."""

    def __init__(self, group: WeightGroup, bucket_bytes: int) -> None:
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise WeightTransportError(f"bucket_bytes must be an int >= 1, got {bucket_bytes!r}")
        self.group = group
        self.bucket_bytes = bucket_bytes

    def plan(self, specs: Sequence[ParamSpec]) -> list[list[ParamSpec]]:
        """The buckets of ``specs``: the plan the client posts to the servers for the same specs."""
        return plan_weight_buckets(specs, self.bucket_bytes)

    def send_packed(self, flats: Sequence[torch.Tensor]) -> int:
        """Broadcast buckets packed earlier (:func:`flatten_bucket` of each planned bucket, in
        order); returns bytes sent."""
        started = time.perf_counter()
        for flat in flats:
            self.group.broadcast(flat)
        total = sum(flat.numel() for flat in flats)
        logger.info(
            "broadcast %d packed buckets, %d bytes, over %s in %.1f ms (host time)",
            len(flats),
            total,
            self.group.name,
            1e3 * (time.perf_counter() - started),
        )
        return total

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], specs: Sequence[ParamSpec]) -> int:
        """Broadcast ``named_tensors`` (streamed in ``specs`` order) bucket by bucket; returns bytes sent.

        Holds at most one bucket's tensors at a time; floating-point tensors may come in another
        floating-point dtype than their spec's and are cast on the way (:func:`flatten_bucket`).
        Raises :class:`WeightTransportError` when the stream differs from ``specs`` (a name, dtype
        or shape, or the number of tensors).
        """
        started = time.perf_counter()
        packing = 0.0
        stream = iter(named_tensors)
        total = 0
        buckets = self.plan(specs)
        for bucket in buckets:
            packed_from = time.perf_counter()
            wanted = {spec.name for spec in bucket}
            held: dict[str, torch.Tensor] = {}
            for _ in bucket:  # a bucket is a run of consecutive specs, so of consecutive tensors
                name, tensor = next(stream, (None, None))
                if name is None:
                    raise WeightTransportError(
                        f"weight stream ended before the planned tensors {sorted(wanted - set(held))}"
                    )
                if name not in wanted:
                    raise WeightTransportError(
                        f"weight stream gave {name!r} where the plan expects one of {sorted(wanted)}"
                    )
                held[name] = tensor
            flat = flatten_bucket(bucket, held, self.group.device)
            packing += time.perf_counter() - packed_from
            self.group.broadcast(flat)
            total += flat.numel()
        extra = next(stream, None)
        if extra is not None:
            raise WeightTransportError(f"weight stream has tensor {extra[0]!r} beyond the {len(specs)} planned ones")
        logger.info(
            "broadcast %d buckets, %d bytes, over %s in %.1f ms (gather and pack %.1f ms, host time)",
            len(buckets),
            total,
            self.group.name,
            1e3 * (time.perf_counter() - started),
            1e3 * packing,
        )
        return total


@dataclass(frozen=True)
class _Staged:
    """A one-bucket update packed before the servers paused (rank 0 holds the bytes; None elsewhere)."""

    version: int
    bucket_bytes: int
    flat: torch.Tensor | None


class CollectiveTransport(WeightTransport):
    """``collective``: a bucketed broadcast from trainer rank 0 over a group every server joins."""

    name: ClassVar[str] = "collective"
    sends_while_paused: ClassVar[bool] = True

    def __init__(self, source: WeightSource, context: PublishContext) -> None:
        super().__init__(source, context)
        #: the run's group rendezvous port and server count, agreed by every rank at the first plan
        self._port: int | None = None
        self._n_servers = 0
        self._groups: dict[tuple[str | None, int | None, str], WeightGroup] = {}
        self._staged: _Staged | None = None

    def plan(self, version: int) -> WeightUpdateMeta:
        if self._port is None:  # one group for the whole run (the servers keep it)
            from areal_tasks.launch.ports import PortAllocator

            self._port = broadcast_int(PortAllocator().allocate(1)[0] if self.is_sender else 0)
            self._n_servers = broadcast_int(self.context.n_servers)
        return WeightUpdateMeta.collective(
            version,
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            self._port,
            1 + self._n_servers,
            backend="nccl" if self.source.device.type == "cuda" else "gloo",
        )

    def prepare(self, meta: WeightUpdateMeta) -> dict[str, float]:
        """Gather and pack a one-bucket update now, while the servers still generate (every rank;
        the gathers are collective); nothing when the weights need several buckets."""
        started = time.perf_counter()
        self._staged = None
        buckets = plan_weight_buckets(self.source.weight_specs(), meta.bucket_bytes)
        if len(buckets) != 1:
            return {"perf/weight_pack_s": 0.0}
        stream = self.source.iter_weights()
        flat = None
        if self.is_sender:
            flat = flatten_bucket(buckets[0], dict(stream), _bucket_device(meta))
        else:  # take part in every gather
            collections.deque(stream, maxlen=0)
        self._staged = _Staged(meta.version, meta.bucket_bytes, flat)
        return {"perf/weight_pack_s": time.perf_counter() - started}

    def send(self, meta: WeightUpdateMeta) -> None:
        """Broadcast every bucket (rank 0; the others take part in the gathers): one broadcast of
        the bytes :meth:`prepare` packed for this version and bucket size, else gathered now."""
        staged, self._staged = self._staged, None
        if staged is not None and (staged.version, staged.bucket_bytes) != (meta.version, meta.bucket_bytes):
            staged = None  # staged for another update: gather afresh
        stream = self.source.iter_weights() if staged is None else iter(())
        if not self.is_sender:
            collections.deque(stream, maxlen=0)
        else:
            sender = BucketedBroadcastSender(self._group(meta), meta.bucket_bytes)
            if staged is not None and staged.flat is not None:
                sent = sender.send_packed([staged.flat])
            else:  # sender.send's pack casts to the specs' dtype
                sent = sender.send(stream, self.source.weight_specs())
            logger.info("weights version %d broadcast to %s: %d bytes", meta.version, meta.group_name, sent)
        rank_barrier()

    def server_update(self, meta: WeightUpdateMeta) -> tuple[WeightUpdateMeta, list[list[ParamSpec]] | None]:
        return meta, plan_weight_buckets(self.source.weight_specs(), meta.bucket_bytes)

    @property
    def servers_must_leave(self) -> bool:
        return self._port is not None

    def _group(self, meta: WeightUpdateMeta) -> WeightGroup:
        """The group of ``meta``, joined as rank 0 on first use (cached per group address)."""
        key = (meta.master_addr, meta.master_port, meta.group_name)
        group = self._groups.get(key)
        if group is None:
            group = join_as_trainer(meta, _bucket_device(meta))
            self._groups[key] = group
        return group

    def close(self) -> None:
        """Leave every group this rank joined (rank 0; bounded), drop staged bytes."""
        self._staged = None
        while self._groups:
            _, group = self._groups.popitem()
            group.destroy()

    @classmethod
    def receiver(cls, device: torch.device) -> CollectiveReceiver:
        return CollectiveReceiver(device)

    @classmethod
    def placement_problems(cls, cfg: JobConfig, alloc: AllocationMode) -> list[tuple[str, str]]:
        if alloc.actor_shares_inference_gpus() and cfg.cluster.gpus_per_node > 0:
            return [
                (
                    "rollout.weight_update",
                    f"'collective' cannot reach servers on the trainer's own GPUs: in "
                    f"{cfg.allocation!r} the actor shares them with the inference servers ('|'), and NCCL does "
                    "not connect two processes on one GPU; set rollout.weight_update=shared (or disk), or give "
                    "each its own GPUs with '+'",
                )
            ]
        return []


def _bucket_device(meta: WeightUpdateMeta) -> torch.device:
    """Where rank 0 packs and broadcasts: the current CUDA device for ``nccl``, the CPU for ``gloo``."""
    import torch

    if meta.backend != "nccl":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise WeightTransportError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
    return torch.device("cuda", torch.cuda.current_device())


class CollectiveReceiver(WeightReceiver):
    """A server's end: the groups it joined, by name, and the buckets it receives over them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.groups: dict[str, WeightGroup] = {}
        #: the per-expert tensors of the update under way, until their layers are complete
        self._fold: ExpertFold | None = None

    def join(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float = 1800.0,
        rendezvous_timeout_s: float | None = None,
    ) -> WeightGroup:
        """Join ``group_name`` as ``rank`` (:func:`~areal_tasks.weights.group.join_as_server`;
        blocks until every member joined). A name already joined is refused."""
        if group_name in self.groups:
            raise WeightTransportError(f"group {group_name!r} exists")
        group = join_as_server(
            master_address,
            master_port,
            rank,
            world_size,
            group_name,
            backend,
            self.device,
            timeout_s,
            rendezvous_timeout_s,
        )
        self.groups[group_name] = group
        return group

    def open(self, meta: WeightUpdateMeta, rank: int) -> None:
        """Join ``meta``'s group as ``rank`` unless joined already (what the client's
        ``/init_weights_update_group`` makes a server do)."""
        if meta.group_name not in self.groups:
            if meta.master_addr is None or meta.master_port is None or meta.world_size is None:
                raise WeightTransportError(f"a {meta.type!r} update names no weight-update group to join")
            self.join(
                meta.master_addr, meta.master_port, rank, meta.world_size, meta.group_name, meta.backend, meta.timeout_s
            )

    def leave(self, group_name: str, timeout_s: float | None = None) -> bool | None:
        """Leave ``group_name`` (bounded; see :meth:`WeightGroup.destroy`): True when destroyed
        cleanly, False when aborted after the bound, None when no such group was joined."""
        group = self.groups.pop(group_name, None)
        return None if group is None else group.destroy(timeout_s)

    def receive(self, load: WeightLoad, served: ServedWeights | None = None) -> dict[str, torch.Tensor]:
        """Receive one bucket over ``load.group_name``. With ``served``: in the served names, per-expert
        tensors held back until their layer's experts are all here and then handed over stacked
        (:class:`~areal_tasks.weights.expert_fold.ExpertFold`; :meth:`finish_update` refuses an
        update that ends with some held back), checked by name and shape (a bucket is part of an
        update, so it need not be complete). Without: every tensor as it came (vLLM loads
        per-expert names itself)."""
        group = self.groups.get(load.group_name or "")
        if group is None:
            raise WeightTransportError(f"group {load.group_name!r} is not initialized")
        received = receive_bucket(group, load.names, load.dtypes, load.shapes, load.load_format)
        if served is None:
            return received
        if self._fold is None or self._fold.specs != served.specs:
            self._fold = ExpertFold(served.specs)
        folded = self._fold.add(received)
        served.check(folded, complete=False)
        return folded

    def finish_update(self) -> None:
        """Refuse an update whose buckets left a layer's experts incomplete, naming them (see
        :meth:`ExpertFold.finish`); the next update starts afresh either way."""
        fold, self._fold = self._fold, None
        if fold is not None:
            fold.finish()

    def close(self, timeout_s: float | None = None) -> None:
        """Leave every group (server shutdown); each leave is bounded (``timeout_s``, default
        :data:`~areal_tasks.weights.group.GROUP_DESTROY_TIMEOUT_S`), so a gone trainer cannot hang it."""
        for name in list(self.groups):
            self.groups.pop(name).destroy(timeout_s)


def receive_bucket(
    group: WeightGroup, names: list[str], dtypes: list[str], shapes: list[list[int]], load_format: str | None
) -> dict[str, torch.Tensor]:
    """Receive one update from rank 0 of ``group``: one flattened ``uint8`` broadcast
    (``flattened_bucket``), or one broadcast per tensor in ``names`` order (None/``auto``)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise WeightTransportError(f"names ({len(names)}), dtypes ({len(dtypes)}) and shapes ({len(shapes)}) differ")
    types = [dtype_of(d) for d in dtypes]
    with on_device(group.device):
        return _receive(group, names, types, shapes, load_format)


def _receive(
    group: WeightGroup,
    names: list[str],
    types: list[torch.dtype],
    shapes: list[list[int]],
    load_format: str | None,
) -> dict[str, torch.Tensor]:
    import torch
    import torch.distributed as dist

    if load_format == "flattened_bucket":
        flat = torch.empty(flat_bytes(names, types, shapes), dtype=torch.uint8, device=group.device)
        dist.broadcast(flat, src=0, group=group.process_group)
        received = split_flat(flat, names, types, shapes)
    elif load_format in (None, "auto"):
        received = {n: torch.empty(s, dtype=d, device=group.device) for n, d, s in zip(names, types, shapes)}
        handles = [dist.broadcast(t, src=0, group=group.process_group, async_op=True) for t in received.values()]
        for handle in handles:
            handle.wait()
    else:
        raise WeightTransportError(f"load_format {load_format!r} is not supported (use none or flattened_bucket)")
    if group.device.type == "cuda":
        torch.cuda.current_stream(group.device).synchronize()
    return received
