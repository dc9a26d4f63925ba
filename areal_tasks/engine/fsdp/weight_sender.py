"""Publishing the engine's current weights to the inference servers (disk, collective or shared).

Both paths gather full HF-named tensors shard by shard on every rank (a collective over the engine's
mesh; LoRA merged, tied head dropped); only rank 0 writes or broadcasts them.

* disk: rank 0 writes sharded safetensors + config + tokenizer atomically under ``meta.path``;
* collective (SGLang's protocol, :mod:`areal_tasks.engine.weights.collective`): rank 0 joins the
  weight-update group once (cached per group address; the first join must run while the client
  makes the servers join) and broadcasts one flattened ``uint8`` tensor per bucket of
  ``plan_weight_buckets(weight_specs(engine), meta.bucket_bytes)``. The controller hands the client
  the same plan, so every server receives each bucket as ``/update_weights_from_distributed``
  describes it.

**Wire dtype.** Both paths publish every floating-point tensor in the engine's *compute* dtype
(:func:`publish_dtype`: ``compute_dtype_name(config.dtype, device)``, bf16 on GPU by default, fp32
on CPU), not in the dtype of the fp32 master weights FSDP keeps: the servers run the compute dtype
anyway, and fp32 would send twice the bytes. :func:`weight_specs` (the plan the client hands the
servers) applies the same cast, so the plan and the bytes on the wire agree. Integer tensors pass
unchanged.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.engine.weights.collective import WeightGroup

logger = logging.getLogger(__name__)


def publish_dtype(engine: FSDPEngine) -> torch.dtype:
    """The dtype floating-point weights are published in: the engine's compute dtype."""
    import torch

    from areal_tasks.engine.fsdp.build import compute_dtype_name

    return getattr(torch, compute_dtype_name(engine.config.dtype, engine.device))


def cast_floating(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` with every floating-point tensor cast to ``dtype`` (lazily, one at a time;
    integer and bool tensors unchanged). Works on ``meta`` tensors, so specs and bytes share it."""
    for name, tensor in named_tensors:
        yield name, (tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor)


def weight_specs(engine: FSDPEngine) -> list[ParamSpec]:
    """Name, dtype and full shape of every tensor :func:`send_weights` publishes, in sending order
    (floating-point ones in :func:`publish_dtype`).

    Local (no gather): any rank may call it, at any time. They never change during a run, so the
    engine keeps them (``FSDPEngine.weight_specs``) instead of walking the state dict every update.
    """
    from areal_tasks.engine.fsdp.export import iter_hf_meta
    from areal_tasks.engine.weights.collective import spec_of

    return [spec_of(name, tensor) for name, tensor in cast_floating(iter_hf_meta(engine.model), publish_dtype(engine))]


@dataclass(frozen=True)
class StagedWeights:
    """An update packed before the servers paused: a one-bucket collective one (rank 0 holds the
    bytes in ``flat``) or a shared one (the bytes are in the shared buffers; ``flat`` is None)."""

    version: int
    bucket_bytes: int
    flat: torch.Tensor | None
    kind: str = "collective"


def stage_weights(engine: FSDPEngine, meta: WeightUpdateMeta) -> float:
    """Gather and pack the weights of a collective ``meta`` now, while the servers still generate;
    returns the seconds it took. Every rank calls it (the gathers are collective).

    Only when all weights fit in one bucket: the paused update then is one broadcast. With more
    buckets nothing is staged (holding every bucket would cost the whole model's bytes again) and
    :func:`send_weights` packs bucket by bucket during the pause, as without staging.
    """
    import time

    import torch
    import torch.distributed as dist

    from areal_tasks.api.inference import plan_weight_buckets
    from areal_tasks.engine.fsdp.export import iter_hf_tensors
    from areal_tasks.engine.weights.collective import flatten_bucket

    started = time.perf_counter()
    engine.staged_weights = None
    if meta.type == "shared" and engine.role == "actor":
        _pack_shared(engine)
        engine.staged_weights = StagedWeights(meta.version, 0, None, kind="shared")
        return time.perf_counter() - started
    if meta.type != "collective" or engine.role != "actor":
        return 0.0
    buckets = plan_weight_buckets(engine.weight_specs(), meta.bucket_bytes)
    if len(buckets) != 1:
        return 0.0
    stream = iter_hf_tensors(engine.model, engine.device, in_param_dtype=True)
    flat = None
    if dist.get_rank() == 0:
        device = torch.device("cuda", torch.cuda.current_device()) if meta.backend == "nccl" else torch.device("cpu")
        flat = flatten_bucket(buckets[0], dict(stream), device)
    else:  # take part in every gather
        collections.deque(stream, maxlen=0)
    engine.staged_weights = StagedWeights(meta.version, meta.bucket_bytes, flat)
    return time.perf_counter() - started


def send_weights(engine: FSDPEngine, meta: WeightUpdateMeta) -> None:
    """Publish ``engine``'s weights as ``meta`` says; every rank of the engine must call it.

    A collective update that :func:`stage_weights` packed for the same version and bucket size is
    one broadcast of the packed bytes; anything else gathers and packs here.
    """
    import torch.distributed as dist

    from areal_tasks.engine.fsdp.export import iter_hf_tensors

    if engine.role != "actor":
        raise EngineError(f"only an actor publishes weights to inference servers, this engine is a {engine.role}")
    staged, engine.staged_weights = engine.staged_weights, None
    if meta.type == "shared":
        if staged is None or (staged.kind, staged.version) != ("shared", meta.version):
            _pack_shared(engine)
        dist.barrier()
        return
    if staged is not None and (staged.kind, staged.version, staged.bucket_bytes) != (
        "collective",
        meta.version,
        meta.bucket_bytes,
    ):
        staged = None  # staged for another update: gather afresh
    is_rank0 = dist.get_rank() == 0
    stream = iter_hf_tensors(engine.model, engine.device, in_param_dtype=True) if staged is None else iter(())
    if not is_rank0:  # take part in every gather; rank 0 does the writing or sending
        collections.deque(stream, maxlen=0)
    elif meta.type == "disk":
        _write_hf(engine, meta.path, cast_floating(stream, publish_dtype(engine)))
        logger.info("weights version %d written to %s", meta.version, meta.path)
    else:
        from areal_tasks.engine.weights.collective import BucketedBroadcastSender

        sender = BucketedBroadcastSender(_group(engine, meta), meta.bucket_bytes)
        # unstaged, sender.send's pack casts to the specs' dtype
        sent = sender.send_packed([staged.flat]) if staged is not None else sender.send(stream, engine.weight_specs())
        logger.info("weights version %d broadcast to %s: %d bytes", meta.version, meta.group_name, sent)
    dist.barrier()


def _pack_shared(engine: FSDPEngine) -> None:
    """Gather the weights (every rank) and pack them into this rank's shared buffer, making the
    buffers on the first call (each GPU rank one on its GPU; on CPU rank 0 one file)."""
    import torch.distributed as dist

    from areal_tasks.engine.fsdp.export import iter_hf_tensors
    from areal_tasks.engine.weights.shared import SharedWeightBuffer, shared_layout

    layout = shared_layout(engine.weight_specs())
    holds = engine.device.type == "cuda" or dist.get_rank() == 0
    if engine.shared_buffer is None and not engine.shared_descriptions:
        buffer = SharedWeightBuffer(sum(spec.nbytes for spec in layout), engine.device) if holds else None
        descriptions: list = [None] * dist.get_world_size()
        dist.all_gather_object(descriptions, buffer.describe() if buffer is not None else None)
        engine.shared_buffer = buffer
        engine.shared_descriptions = tuple(d for d in descriptions if d is not None)
    stream = iter_hf_tensors(engine.model, engine.device, in_param_dtype=True)
    if engine.shared_buffer is None:
        collections.deque(stream, maxlen=0)  # take part in every gather
    else:
        engine.shared_buffer.pack(layout, stream)


def shared_buffers(engine: FSDPEngine) -> tuple[dict, ...]:
    """The descriptions of every rank's shared buffer (made by the first shared update's pack)."""
    if not engine.shared_descriptions:
        raise EngineError(
            "no shared weight buffer yet: prepare_weight_update or update_weights with a "
            "shared WeightUpdateMeta makes them"
        )
    return engine.shared_descriptions


def close_shared_buffer(engine: FSDPEngine) -> None:
    """Drop this rank's shared buffer (its file, on CPU); servers keep what they mapped."""
    if engine.shared_buffer is not None:
        engine.shared_buffer.close()
    engine.shared_buffer, engine.shared_descriptions = None, ()


def _write_hf(engine: FSDPEngine, path: str | None, stream: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Rank 0: write ``stream`` as an HF directory at ``path`` (atomically, with config and tokenizer)."""
    from areal_tasks.models.hf_dir import hf_config_of, write_hf_dir

    if path is None:
        raise EngineError("a disk weight update needs meta.path")
    tensors = {name: tensor.cpu() for name, tensor in stream}
    write_hf_dir(path, tensors, hf_config_of(engine.model), source_dir=engine.model_path)


def _group(engine: FSDPEngine, meta: WeightUpdateMeta) -> WeightGroup:
    from areal_tasks.engine.weights.collective import join_weight_group

    key = (meta.master_addr, meta.master_port, meta.group_name)
    group = engine.weight_groups.get(key)
    if group is None:
        group = join_weight_group(meta)
        engine.weight_groups[key] = group
    return group


def close_weight_groups(engine: FSDPEngine) -> None:
    """Leave every weight-update group ``engine`` joined (rank 0; a no-op elsewhere)."""
    while engine.weight_groups:
        _, group = engine.weight_groups.popitem()
        group.destroy()
