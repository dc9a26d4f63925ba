"""AdamW and gradient clipping for the archon engine's mixed shardings.

Parameters live on different meshes (dense ones on ``dp x cp`` and ``tp``, experts on ``edp x
ep``) and, with pipeline parallelism, on different ranks altogether. The optimizer keeps one
parameter group per sharding (multi-tensor kernels never mix meshes); the global gradient norm is
each stage's norm (:func:`~areal_tasks.engine.fsdp.optim.global_grad_norm` reduces over the mesh
dims each gradient is sharded on) squared and summed over the pipeline ranks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.engine.fsdp.optim import clip_coefficient, global_grad_norm
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from areal_tasks.config.engine import OptimizerConfig

logger = logging.getLogger(__name__)

__all__ = ["build_archon_optimizer", "clip_grad_norm_across_stages"]


def _sharding_key(param: torch.Tensor) -> str:
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return "plain"
    mesh = param.device_mesh
    return f"{mesh.mesh_dim_names}{tuple(mesh.mesh.flatten().tolist())}{param.placements}"


def build_archon_optimizer(
    params: list[torch.nn.Parameter], cfg: OptimizerConfig, *, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over ``params``, one parameter group per sharding (fused on CUDA)."""
    import torch

    if cfg.type != "adamw":
        raise EngineError(f"optimizer.type must be 'adamw', got {cfg.type!r}")
    if not params:
        raise EngineError("the model has no trainable parameters on this rank")
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(_sharding_key(p), []).append(p)
    return torch.optim.AdamW(
        [{"params": group} for group in groups.values()],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=device.type == "cuda",
    )


def grad_norm_across_stages(params: list[torch.nn.Parameter], pp_group: ProcessGroup | None) -> torch.Tensor:
    """The global L2 norm of the gradients of every stage (a collective over ``pp_group``)."""
    import torch.distributed as dist

    norm = global_grad_norm(params)
    if pp_group is None:
        return norm
    squared = norm.pow(2)
    dist.all_reduce(squared, group=pp_group)
    return squared.sqrt()


def clip_grad_norm_across_stages(
    params: list[torch.nn.Parameter],
    max_norm: float,
    pp_group: ProcessGroup | None,
    *,
    also: list[torch.nn.Parameter] | None = None,
) -> torch.Tensor:
    """Scale the gradients so that their global norm is at most ``max_norm`` (0: only measure it);
    returns the norm before clipping. A non-finite norm leaves them untouched (the step is skipped).
    ``also``: the parameters to scale when they are more than those the norm counts (a tied
    weight's second copy)."""
    import torch
    from torch.distributed.tensor import DTensor

    norm = grad_norm_across_stages(params, pp_group)
    coef = clip_coefficient(norm, max_norm)
    if coef is not None:
        with torch.no_grad():
            for p in also if also is not None else params:
                if p.grad is not None:
                    grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    grad.mul_(coef.to(grad.device, grad.dtype))
    return norm
