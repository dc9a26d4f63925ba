"""``areal``: a vLLM weight-transfer engine that loads weights from disk or from a gloo/NCCL broadcast.

vLLM fixes one weight-transfer backend per server at start-up, so one engine takes both kinds of
update our trainer publishes; each ``/update_weights`` call says which by its fields:

* ``{"path": "<dir>"}``: load the HF safetensors of a directory (the disk transport's receiving
  side, :mod:`areal_tasks.weights.disk`, streamed file by file); needs no init call. The directory
  must lie in the served model's directory or one that ``$AREAL_WEIGHT_ROOTS`` lists (the job's
  launcher sets it; :mod:`areal_tasks.weights.roots`): vLLM's key guards only ``/v1``, so this
  route is open to whoever reaches the server;
* ``{"names", "dtype_names", "shapes"}``: receive one bucket, a single ``uint8`` broadcast from
  rank 0 of the weight-update group holding the tensors back to back (the collective protocol of
  docs/inference.md). The group is joined once with ``/init_weight_transfer_engine`` (``init_info``:
  ``master_address, master_port, rank_offset, world_size, group_name, backend, timeout_s``); the join
  and the receive are the collective transport's receiving side
  (:class:`areal_tasks.weights.collective.CollectiveReceiver`), as in the embedded server, so both
  servers meet the same trainer-side sender.

One update is ``/start_weight_update`` -> ``/update_weights`` (one or more) ->
``/finish_weight_update``. ``start`` turns on vLLM's layerwise reload (layers go to the meta
device, their weight loaders are wrapped); tensors go through ``model.load_weights``, which maps HF
names onto vLLM's fused parameters; a layer is re-materialised and re-processed
(``process_weights_after_loading``, which on CPU rebuilds the packed/oneDNN GEMM weights) once all
its weights have arrived; ``finish`` processes the rest. That is the path of vLLM's own NCCL engine;
a bare ``param.copy_()`` would leave CPU GEMMs computing with the old packed weights.

Departures from vLLM's ``WeightTransferEngine``: ``update_weights`` synchronises the device only
on an accelerator (``torch.accelerator.synchronize()`` raises on a CPU-only host), and
``finish_weight_update`` raises when a parameter received no tensor during the update (vLLM only
logs a warning and keeps the old values, which would publish a half-updated policy).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from areal_tasks.errors import InferenceError
from areal_tasks.weights.base import WeightLoad
from areal_tasks.weights.collective import CollectiveReceiver
from areal_tasks.weights.disk import iter_safetensors, safetensors_files
from areal_tasks.weights.roots import WeightRoots, roots_from_env

logger = logging.getLogger(__name__)

__all__ = ["ArealWeightTransferEngine", "BucketUpdateInfo", "DiskUpdateInfo", "GroupInitInfo"]


@dataclass
class GroupInitInfo(WeightTransferInitInfo):
    """Where and how to join the weight-update group (trainer = rank 0)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "areal_weight_update"
    backend: str = "gloo"
    timeout_s: float = 300.0


@dataclass
class DiskUpdateInfo(WeightTransferUpdateInfo):
    """Load every tensor of the safetensors directory ``path``."""

    path: str


@dataclass
class BucketUpdateInfo(WeightTransferUpdateInfo):
    """Receive one bucket: its tensors in broadcast order (the field names of vLLM's NCCL engine)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names ({len(self.names)}), dtype_names ({len(self.dtype_names)}) and shapes "
                f"({len(self.shapes)}) must have the same length"
            )


class ArealWeightTransferEngine(WeightTransferEngine[GroupInitInfo, DiskUpdateInfo | BucketUpdateInfo]):
    """Disk or broadcast weight updates through vLLM's layerwise reload (see the module doc)."""

    init_info_cls = GroupInitInfo
    update_info_cls = DiskUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the collective receiving end, made by the init call (on the worker's device)
        self.collective: CollectiveReceiver | None = None
        #: the group joined by the last init call (one per engine), or None
        self.group: str | None = None
        self._loaded: set[str] = set()
        #: where disk updates may be read from: the served model's directory and $AREAL_WEIGHT_ROOTS
        served = str(self.model_config.model)
        self.weight_roots = WeightRoots.of([*([served] if os.path.isdir(served) else []), *roots_from_env(os.environ)])

    # -- connection ----------------------------------------------------------------------------

    def init_transfer_engine(self, init_info: GroupInitInfo) -> None:
        """Join the weight-update group (blocks until the trainer and every server have joined)."""
        if self.group is not None:
            self.shutdown()
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.collective = CollectiveReceiver(self.device)
        self.collective.join(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker_rank,
            init_info.world_size,
            init_info.group_name,
            init_info.backend,
            init_info.timeout_s,
        )
        self.group = init_info.group_name

    def shutdown(self) -> None:
        """Leave the weight-update group, if joined."""
        if self.collective is not None:
            self.collective.close()
        self.collective = None
        self.group = None

    # -- one update ----------------------------------------------------------------------------

    def start_weight_update(self) -> None:
        """Open an update: layerwise reload on, nothing loaded yet."""
        initialize_layerwise_reload(self.model)
        self._loaded = set()

    def parse_update_info(self, update_dict: dict[str, Any]) -> DiskUpdateInfo | BucketUpdateInfo:
        """A disk update (``path``) or a bucket (``names``, ``dtype_names``, ``shapes``)."""
        kind = DiskUpdateInfo if "path" in update_dict else BucketUpdateInfo
        try:
            return kind(**update_dict)
        except TypeError as exc:
            raise ValueError(
                f"update_info must be {{'path'}} or {{'names', 'dtype_names', 'shapes'}}, got keys "
                f"{sorted(update_dict)}: {exc}"
            ) from exc

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive and load one chunk (vLLM's version, without its CPU-incompatible device sync)."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: DiskUpdateInfo | BucketUpdateInfo) -> None:
        """Read the directory or receive the bucket, and load the tensors into the model."""
        if isinstance(update_info, DiskUpdateInfo):
            files = safetensors_files(update_info.path, self.weight_roots)
            count = self._load(iter_safetensors(files))
            logger.info("loaded %d tensors from %d files under %s", count, len(files), update_info.path)
            return
        if self.collective is None or self.group is None:
            raise InferenceError("a bucket update needs /init_weight_transfer_engine (the group) first")
        load = WeightLoad(
            group_name=self.group,
            names=update_info.names,
            dtypes=update_info.dtype_names,
            shapes=update_info.shapes,
            load_format="flattened_bucket",
        )
        count = self._load(self.collective.receive(load).items())
        logger.info("received a bucket of %d tensors over group %s", count, self.group)

    def finish_weight_update(self) -> None:
        """Process the remaining layers; raise if a parameter received no tensor."""
        finalize_layerwise_reload(self.model, self.model_config)
        expected = {name for name, _ in self.model.named_parameters()}
        missing = sorted(expected - self._loaded)
        if missing:
            raise InferenceError(
                f"weight update left {len(missing)} of {len(expected)} parameters at their old values "
                f"(no tensor was received for them), e.g. {missing[:5]}"
            )
        logger.info("weight update applied: %d parameters", len(expected))

    def _load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Feed HF-named tensors to ``model.load_weights``; returns how many there were."""
        count = 0

        def counted() -> Iterable[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in named_tensors:
                count += 1
                yield item

        self._loaded.update(self.model.load_weights(counted()) or ())
        return count
