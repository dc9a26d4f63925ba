"""AdamW, learning-rate schedules with warmup, and global-norm gradient clipping across shards.

The LR multiplier at step ``s`` (0-based, the number of schedule steps taken so far):

* warmup (``s < W``): ``(s + 1) / (W + 1)`` -- never exactly 0, so the first step already moves;
* then ``constant``: 1; ``linear``: from 1 down to ``min_lr_ratio`` at ``total_steps``;
  ``cosine``: ``min + (1 - min) * (1 + cos(pi * progress)) / 2``.

Gradient clipping works on FSDP2/TP DTensor gradients whose shards live on different meshes: each
gradient's local squared norm is summed over exactly the mesh dimensions it is sharded on (never
over replicated ones), so the global norm is exact however the model is split. Norms and scaling
use the multi-tensor (``_foreach``) kernels, and clipping never reads the norm back to the host:
a non-finite norm scales by 1 on the device (the engine then skips the step).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from areal_tasks.config.engine import LRScheduleConfig, OptimizerConfig

logger = logging.getLogger(__name__)


def warmup_steps_of(cfg: LRScheduleConfig, total_steps: int) -> int:
    """Warmup length: ``warmup_steps`` when > 0, else ``warmup_ratio * total_steps`` (rounded down)."""
    if cfg.warmup_steps > 0:
        return int(cfg.warmup_steps)
    return int(cfg.warmup_ratio * total_steps)


def lr_multiplier(step: int, cfg: LRScheduleConfig, total_steps: int) -> float:
    """The factor applied to the peak LR after ``step`` schedule steps."""
    if cfg.type not in ("constant", "linear", "cosine"):
        raise EngineError(f"lr_schedule.type must be constant, linear or cosine, got {cfg.type!r}")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise EngineError(f"lr_schedule.min_lr_ratio must be in [0, 1], got {cfg.min_lr_ratio!r}")
    warmup = warmup_steps_of(cfg, total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if cfg.type == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    floor = cfg.min_lr_ratio
    if cfg.type == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimizerConfig, *, fused: bool = False
) -> torch.optim.AdamW:
    """AdamW over ``params`` that require grad (weight decay on every trainable tensor).

    ``fused``: torch's fused AdamW kernel (one launch per parameter group and dtype; CUDA
    parameters, DTensors included); otherwise torch's default (``foreach`` on CUDA).
    """
    import torch

    if cfg.type != "adamw":
        raise EngineError(f"optimizer.type must be 'adamw', got {cfg.type!r}")
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise EngineError("the model has no trainable parameters (LoRA target_modules matched nothing?)")
    return torch.optim.AdamW(
        trainable,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        **({"fused": True} if fused else {}),
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: LRScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_multiplier` to every param group."""
    import torch

    if total_steps < 1:
        raise EngineError(f"total_steps must be >= 1 for an LR schedule, got {total_steps}")
    lr_multiplier(0, cfg, total_steps)  # validate the config now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg, total_steps))


def _sharded_dims(grad: torch.Tensor) -> tuple[object, tuple[int, ...]]:
    """(mesh, mesh dims the tensor is sharded on) for a DTensor; (None, ()) for a plain tensor.

    Replicated dimensions are left out: summing over them would count the same values twice.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return None, ()
    dims = []
    for i, placement in enumerate(grad.placements):
        if placement.is_partial():
            raise EngineError("gradient norm of a Partial DTensor is undefined; reduce gradients first")
        if placement.is_shard() or type(placement).__name__ == "_StridedShard":
            dims.append(i)
    return grad.device_mesh, tuple(dims)


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A gradient's local shard (the tensor itself when it is not a DTensor), without autograd
    (with gradients enabled ``to_local`` runs an autograd function: host work that clipping would
    pay once per gradient)."""
    import torch
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return grad
    with torch.no_grad():
        return grad.to_local()


def global_grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all gradients of ``params`` across every shard (fp32 scalar, same on all ranks)."""
    import torch
    import torch.distributed as dist

    # Keyed by a rank-independent description of (mesh, sharded dims), so every rank issues the
    # same all-reduces in the same order.
    groups: dict[tuple[str, tuple[int, ...]], list[torch.Tensor]] = {}
    meshes: dict[str, object] = {}
    keys_of_meshes: dict[int, str] = {}
    device = None
    for p in params:
        if p.grad is None:
            continue
        mesh, dims = _sharded_dims(p.grad)
        local = _local(p.grad)
        device = local.device
        if mesh is None:
            mesh_key = ""
        else:  # once per mesh object: DeviceMesh.mesh rebuilds its tensor on every access
            mesh_key = keys_of_meshes.get(id(mesh)) or keys_of_meshes.setdefault(
                id(mesh), f"{mesh.mesh_dim_names}{tuple(mesh.mesh.shape)}"
            )
        key = (mesh_key, dims)
        meshes[mesh_key] = mesh
        groups.setdefault(key, []).append(local.detach())
    if device is None:
        raise EngineError("no gradients to clip: was backward run on a loss that depends on the parameters?")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for (mesh_key, dims), tensors in sorted(groups.items()):
        partial = _sum_of_squares(tensors)
        mesh = meshes[mesh_key]
        for dim in dims:
            dist.all_reduce(partial, group=mesh.get_group(dim))
        total = total + partial
    return total.sqrt()


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """fp32 sum of the squared L2 norms of ``tensors`` (multi-tensor kernels per device and dtype)."""
    import torch

    by_kind: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((str(t.device), t.dtype), []).append(t)
    parts = []
    for group in by_kind.values():
        norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t for t in group], 2)
        parts.append(torch.stack(norms).pow(2).sum().to(tensors[0].device))
    return torch.stack(parts).sum()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale gradients so that their global norm is at most ``max_norm`` (0 = only measure it).

    Returns the norm before clipping. A non-finite norm leaves the gradients untouched; the caller
    decides to skip the step.
    """
    import torch

    norm = global_grad_norm(params)
    coef = clip_coefficient(norm, max_norm)
    if coef is not None:
        by_kind: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                local = _local(p.grad)
                by_kind.setdefault((str(local.device), local.dtype), []).append(local)
        with torch.no_grad():
            for group in by_kind.values():
                torch._foreach_mul_(group, coef.to(group[0].device, group[0].dtype))
    return norm


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor | None:
    """The factor that brings gradients of global norm ``norm`` to at most ``max_norm``, as a device
    tensor (no read-back to decide): ``min(1, max_norm / norm)``, and 1 where the norm is not finite
    (the step is skipped then). None when ``max_norm`` is 0 (no clipping)."""
    import torch

    if max_norm <= 0:
        return None
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return torch.where(torch.isfinite(norm), coef, torch.ones_like(coef))
