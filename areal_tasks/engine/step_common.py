"""What every train engine's step shares, whatever shards its model: joining the process group and
picking the device, the batch split into micro-batches on the host and sent to the device, the sums
over the data-parallel ranks, and one micro-batch's backward under the loss contract
(``api/train_engine.py``).

Loss contract, per micro-batch: ``loss * weight / total_weight * grad_scale`` is backpropagated,
``total_weight`` summing the loss weights of every micro-batch on every data-parallel rank and
``grad_scale`` the size of the group whose mean the gradient reduction takes (FSDP's), so the
gradients are an exactly weighted sum however the batch is split. A micro-batch of weight 0 (a
padding one) still runs a backward of zero, which keeps the collectives of every rank in step.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from areal_tasks.api.train_engine import Batch, LossWeightFn
    from areal_tasks.config.micro_batch import MicroBatchSpec
    from areal_tasks.engine.microbatch import MicroBatchPlan

logger = logging.getLogger(__name__)

__all__ = [
    "all_reduce_sum",
    "backward_micro_batch",
    "init_default_group",
    "local_device",
    "loss_weights",
    "plan_micro_batches",
    "to_device",
]


def init_default_group() -> None:
    """Join the default process group: ``env://`` under a launcher, else a world of one.

    A world of one rendezvouses through an in-process ``HashStore``: nothing to share with another
    process, so no file store (which left a ``/tmp/areal_pg_*`` directory behind per engine).
    """
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from areal_tasks.launch.netif import pin_socket_interface

        pin_socket_interface()  # ranks on several nodes: listen on the node's address, not loopback
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def local_device() -> torch.device:
    """This rank's GPU (by its local rank) or the CPU."""
    import torch

    if torch.cuda.is_available():
        from areal_tasks.api.scheduler import local_device_index

        index = local_device_index()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def to_device(mb: Batch, device: torch.device) -> Batch:
    """A host micro-batch on ``device``: pinned, non-blocking copies on CUDA (no wait for queued work)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in mb.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in mb.items()}


def plan_micro_batches(
    batch: Batch, spec: MicroBatchSpec, dp_group: ProcessGroup | None, device: torch.device
) -> tuple[MicroBatchPlan, list[Batch], list[tuple[int, ...]]]:
    """(the plan, split on the host with as many micro-batches on every rank of ``dp_group``; its
    micro-batches on the device; their host sequence bounds)."""
    from areal_tasks.api.batch import CU_SEQLENS
    from areal_tasks.engine.microbatch import agree_on_n_mbs, split_into_micro_batches

    host = {k: v if v.device.type == "cpu" else v.cpu() for k, v in batch.items()}
    plan = split_into_micro_batches(host, spec)
    n = agree_on_n_mbs(plan.n_micro_batches, dp_group)
    if n != plan.n_micro_batches:
        plan = split_into_micro_batches(host, spec, n_mbs_override=n)
    on_device = [to_device(mb, device) for mb in plan.micro_batches]
    bounds = [tuple(mb[CU_SEQLENS].tolist()) for mb in plan.micro_batches]
    return plan, on_device, bounds


def all_reduce_sum(values: list[float], group: ProcessGroup | None, device: torch.device) -> list[float]:
    """``values`` summed over ``group`` (in float64; no device round trip for a group of one)."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return tensor.tolist()


def loss_weights(micro_batches: Sequence[Batch], loss_weight_fn: LossWeightFn) -> list[float]:
    """Every micro-batch's loss weight, computed on its host copy (EngineError for a negative or
    non-finite one)."""
    weights = [float(loss_weight_fn(mb)) for mb in micro_batches]
    if any(w < 0 or not math.isfinite(w) for w in weights):
        raise EngineError(f"loss_weight_fn returned an invalid weight in {weights}")
    return weights


def backward_micro_batch(
    loss: torch.Tensor,
    outputs: Mapping[str, Any],
    weight: float,
    total_weight: float,
    grad_scale: float,
) -> None:
    """One micro-batch's backward under the loss contract (a weight of 0 backpropagates zero through
    ``outputs``, so every rank still runs the same collectives)."""
    if weight > 0:
        (loss * (weight / total_weight * grad_scale)).backward()
    else:
        (sum(v.sum() for v in outputs.values()) * 0.0).backward()
