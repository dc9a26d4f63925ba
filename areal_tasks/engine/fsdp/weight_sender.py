"""Publishing the engine's current weights to the inference servers (disk or collective).

Both paths gather full HF-named tensors shard by shard on every rank (a collective over the engine's
mesh; LoRA merged, tied head dropped); only rank 0 writes or broadcasts them.

* disk: rank 0 writes sharded safetensors + config + tokenizer atomically under ``meta.path``;
* collective (SGLang's protocol, :mod:`areal_tasks.engine.weights.collective`): rank 0 joins the
  weight-update group once (cached per group address; the first join must run while the client
  makes the servers join) and broadcasts one flattened ``uint8`` tensor per bucket of
  ``plan_weight_buckets(weight_specs(engine), meta.bucket_bytes)``. The controller hands the client
  the same plan, so every server receives each bucket as ``/update_weights_from_distributed``
  describes it.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.engine.weights.collective import WeightGroup

logger = logging.getLogger(__name__)


def weight_specs(engine: FSDPEngine) -> list[ParamSpec]:
    """Name, dtype and full shape of every tensor :func:`send_weights` publishes, in sending order.

    Local (no gather): any rank may call it, at any time.
    """
    from areal_tasks.engine.fsdp.export import iter_hf_meta
    from areal_tasks.engine.weights.collective import spec_of

    return [spec_of(name, tensor) for name, tensor in iter_hf_meta(engine.model)]


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
    stream = iter_hf_tensors(engine.model, engine.device)
    if dist.get_rank() == 0:
        from areal_tasks.engine.weights.collective import BucketedBroadcastSender

        sender = BucketedBroadcastSender(_group(engine, meta), meta.bucket_bytes)
        sent = sender.send(stream, weight_specs(engine))
        logger.info("weights version %d broadcast to %s: %d bytes", meta.version, meta.group_name, sent)
    else:  # take part in every gather; rank 0 does the sending
        collections.deque(stream, maxlen=0)
    dist.barrier()


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
