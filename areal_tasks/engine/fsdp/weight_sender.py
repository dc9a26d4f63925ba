"""Publishing the engine's current weights to the inference servers (disk or collective).

Both paths gather full HF-named tensors shard by shard on every rank (a collective over the engine's
mesh; LoRA merged, tied head dropped); only rank 0 writes or broadcasts them.

* disk: rank 0 writes sharded safetensors + config + tokenizer atomically under ``meta.path``;
* collective: rank 0 joins the weight-update group once (cached per group address) and sends the
  tensors in buckets (:mod:`areal_tasks.engine.weights.collective`).
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.engine.fsdp.engine import FSDPEngine

logger = logging.getLogger(__name__)


def send_weights(engine: FSDPEngine, meta: WeightUpdateMeta) -> None:
    """Publish ``engine``'s weights as ``meta`` says; every rank of the engine must call it."""
    import torch.distributed as dist

    from areal_tasks.engine.fsdp import checkpoint
    from areal_tasks.engine.fsdp.export import iter_hf_tensors

    if engine.role != "actor":
        raise EngineError(f"only an actor publishes weights to inference servers, this engine is a {engine.role}")
    if meta.type == "disk":
        checkpoint.save_hf(meta.path, engine.model, engine.device, source_dir=engine.model_path)
        logger.info("weights version %d written to %s", meta.version, meta.path)
        return
    is_rank0 = dist.get_rank() == 0
    sender = _sender(engine, meta) if is_rank0 else None
    stream = iter_hf_tensors(engine.model, engine.device)
    if sender is not None:
        sender.send(stream, meta.version)
    else:  # take part in every gather; rank 0 does the sending
        collections.deque(stream, maxlen=0)
    dist.barrier()


def _sender(engine: FSDPEngine, meta: WeightUpdateMeta) -> object:
    from areal_tasks.engine.weights.collective import BucketedBroadcastSender, join_weight_group

    key = (meta.master_addr, meta.master_port, meta.group_name)
    group = engine.weight_groups.get(key)
    if group is None:
        group = join_weight_group(meta, rank=0)
        engine.weight_groups[key] = group
    return BucketedBroadcastSender(group, meta.bucket_bytes)
