"""Bucketed weight broadcast from trainer rank 0 to the inference servers over a collective group.

The weight-update group is separate from the trainer's default process group: trainer rank 0 is
rank 0 of it and hosts its rendezvous store at ``master_addr:master_port``; every inference server
rank joins with ranks ``1..world_size-1``. Both sides build it with :func:`join_weight_group`.

Wire format of one update (all broadcasts from rank 0), repeated per bucket:

1. an int64 ``[1]`` tensor: byte length ``L`` of the bucket header (``0`` ends the update);
2. a uint8 ``[L]`` tensor: UTF-8 JSON ``{"version", "tensors": [{"name", "dtype", "shape",
   "offset", "nbytes"}...]}``;
3. a uint8 tensor holding the bucket's tensors back to back (at most ``bucket_bytes`` unless a
   single tensor is bigger).

Tensors of any dtype travel as raw bytes, so one bucket can mix dtypes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)


@dataclass
class WeightGroup:
    """One member's handle on the weight-update group."""

    backend_pg: Any
    rank: int
    world_size: int
    device: str
    store: Any

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` in place from rank 0 (blocking)."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        self.backend_pg.broadcast([tensor], opts).wait()


def join_weight_group(meta: WeightUpdateMeta, rank: int) -> WeightGroup:
    """Join (rank 0: host) the group described by ``meta`` as ``rank``; blocks until all have joined."""
    import torch
    import torch.distributed as dist

    if meta.type != "collective":
        raise EngineError(f"join_weight_group needs a collective WeightUpdateMeta, got type={meta.type!r}")
    if not 0 <= rank < meta.world_size:
        raise EngineError(f"rank {rank} is outside the weight-update group of size {meta.world_size}")
    timeout = timedelta(seconds=meta.timeout_s)
    tcp = dist.TCPStore(
        meta.master_addr, meta.master_port, meta.world_size, is_master=(rank == 0), timeout=timeout
    )
    store = dist.PrefixStore(meta.group_name, tcp)
    if meta.backend == "nccl":
        if not torch.cuda.is_available():
            raise EngineError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
        pg = dist.ProcessGroupNCCL(store, rank, meta.world_size, dist.ProcessGroupNCCL.Options())
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        pg = dist.ProcessGroupGloo(store, rank, meta.world_size, timeout)
        device = "cpu"
    group = WeightGroup(backend_pg=pg, rank=rank, world_size=meta.world_size, device=device, store=tcp)
    # one tiny broadcast proves every member is connected before the first real update
    probe = torch.zeros(1, dtype=torch.int64, device=device)
    group.broadcast(probe)
    logger.info(
        "joined weight-update group %s as rank %d/%d (%s)", meta.group_name, rank, meta.world_size, meta.backend
    )
    return group


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=flat.device)


class BucketedBroadcastSender:
    """Rank 0 side: packs named tensors into buckets and broadcasts them (see the module doc)."""

    def __init__(self, group: WeightGroup, bucket_bytes: int) -> None:
        if group.rank != 0:
            raise EngineError(f"only rank 0 of the weight-update group sends, this is rank {group.rank}")
        if bucket_bytes < 1:
            raise EngineError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.group = group
        self.bucket_bytes = bucket_bytes

    def _flush(self, version: int, entries: list[tuple[str, torch.Tensor]]) -> None:
        import torch

        header, parts, offset = [], [], 0
        for name, tensor in entries:
            raw = _bytes_of(tensor)
            header.append(
                {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                 "offset": offset, "nbytes": raw.numel()}
            )
            parts.append(raw.to(self.group.device))
            offset += raw.numel()
        encoded = json.dumps({"version": version, "tensors": header}).encode()
        dev = self.group.device
        self.group.broadcast(torch.tensor([len(encoded)], dtype=torch.int64, device=dev))
        self.group.broadcast(torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(dev))
        payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=dev)
        self.group.broadcast(payload)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Broadcast all tensors as update ``version``; returns the number of bytes sent."""
        import torch

        bucket: list[tuple[str, torch.Tensor]] = []
        used = total = 0
        for name, tensor in named_tensors:
            size = tensor.numel() * tensor.element_size()
            if bucket and used + size > self.bucket_bytes:
                self._flush(version, bucket)
                bucket, used = [], 0
            bucket.append((name, tensor))
            used += size
            total += size
        if bucket:
            self._flush(version, bucket)
        self.group.broadcast(torch.zeros(1, dtype=torch.int64, device=self.group.device))
        logger.info("broadcast weights version %d: %d bytes", version, total)
        return total


def receive_weights(group: WeightGroup, expected_version: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver side (ranks >= 1): yield ``(name, tensor)`` of one update until its end marker.

    Tensors are on the group's device. Raises :class:`EngineError` when the update carries another
    version than ``expected_version``.
    """
    import torch

    if group.rank == 0:
        raise EngineError("rank 0 of the weight-update group is the sender, not a receiver")
    dev = group.device
    while True:
        length = torch.zeros(1, dtype=torch.int64, device=dev)
        group.broadcast(length)
        n = int(length.item())
        if n == 0:
            return
        raw_header = torch.empty(n, dtype=torch.uint8, device=dev)
        group.broadcast(raw_header)
        header = json.loads(raw_header.cpu().numpy().tobytes().decode())
        if expected_version is not None and header["version"] != expected_version:
            raise EngineError(f"weight update carries version {header['version']}, expected {expected_version}")
        total = sum(entry["nbytes"] for entry in header["tensors"])
        payload = torch.empty(total, dtype=torch.uint8, device=dev)
        group.broadcast(payload)
        for entry in header["tensors"]:
            dtype = getattr(torch, entry["dtype"])
            # clone before the dtype view: a view needs an offset aligned to the element size
            chunk = payload[entry["offset"] : entry["offset"] + entry["nbytes"]].clone()
            yield entry["name"], chunk.view(dtype).reshape(entry["shape"])
