"""Parallelise an archon decoder (or one pipeline stage of it) in place: tensor parallelism over
``tp``, experts split over ``ep``, context parallelism's process group, then FSDP2.

Order matters: the tensor-parallel plan and the expert split turn parameters into DTensors on
their own mesh dims first; ``fully_shard`` then shards them further over the data-parallel ranks
(FSDP2's 2-D path, which needs both meshes to come from one root: the dense parameters use the
``pp x dp x cp x tp`` mesh, the experts the ``pp x edp x ep x tp`` one).

Tensor parallelism (Megatron style): q/k/v and gate/up column-parallel, o and down row-parallel,
the attention's local head counts divided by ``tp``; embeddings, norms and the head replicated.
MoE layers run replicated over ``tp`` (their input is the full hidden state after the row-parallel
all-reduce), with a tensor-parallel shared expert. Per-head q/k norms get partial gradients on each
tensor-parallel rank: :func:`sync_partial_grads` sums them after backward.

Experts: each MoE layer's ``gate_proj``/``up_proj``/``down_proj`` ``[E, ...]`` become DTensors
sharded on dim 0 over ``ep`` (rank r keeps experts ``[r E/ep, (r+1) E/ep)``) and the layer's
dispatcher the all-to-all one. They form their own FSDP unit over ``edp`` (the ranks that hold the
same experts), or none when ``edp`` is 1 (nothing to shard or reduce: no other rank holds them).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from areal_tasks.engine.archon.parallel.mesh import ArchonMesh

logger = logging.getLogger(__name__)

__all__ = [
    "apply_context_parallel",
    "apply_expert_parallel",
    "apply_fsdp",
    "apply_tensor_parallel",
    "sync_partial_grads",
]

_EXPERT_WEIGHTS = ("gate_proj", "up_proj", "down_proj")


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.layers.values())


def _is_moe(mlp: torch.nn.Module) -> bool:
    return hasattr(mlp, "experts")


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh) -> list[torch.nn.Module]:
    """Split every layer's attention and dense MLP over ``tp_mesh``; returns the modules whose
    replicated weights get partial gradients (q/k norms)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    partial: list[torch.nn.Module] = []
    for layer in _layers(model):
        attn = layer.self_attn
        if attn.n_heads % tp or attn.n_kv_heads % tp:
            raise EngineError(f"{attn.n_heads} heads / {attn.n_kv_heads} kv heads are not divisible by t{tp}")
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),
        }
        mlp = layer.mlp
        ffn = getattr(mlp, "shared_expert", None) if _is_moe(mlp) else mlp
        prefix = "mlp.shared_expert" if _is_moe(mlp) else "mlp"
        if ffn is not None:
            plan.update(
                {
                    f"{prefix}.gate_proj": ColwiseParallel(),
                    f"{prefix}.up_proj": ColwiseParallel(),
                    f"{prefix}.down_proj": RowwiseParallel(),
                }
            )
        parallelize_module(layer, tp_mesh, plan)
        attn.n_heads //= tp
        attn.n_kv_heads //= tp
        partial += [m for m in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if m is not None]
    return partial


def sync_partial_grads(modules: list[torch.nn.Module], tp_mesh: DeviceMesh) -> None:
    """All-reduce (sum) over ``tp`` the gradients of weights applied to local heads only."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = tp_mesh.get_group()
    with torch.no_grad():
        for module in modules:
            for p in module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad, group=group)


def apply_expert_parallel(model: torch.nn.Module, mesh: ArchonMesh) -> int:
    """Split the experts of every MoE layer over ``ep`` (DTensor ``Shard(0)``) and give the layers
    the all-to-all dispatcher; returns the number of MoE layers changed."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    from areal_tasks.engine.archon.parallel.expert_parallel import ExpertParallelDispatcher

    ep_mesh = mesh.expert_mesh["ep"]
    dispatcher = ExpertParallelDispatcher(ep_mesh.get_group())
    changed = 0
    for layer in _layers(model):
        if not _is_moe(layer.mlp):
            continue
        experts = layer.mlp.experts
        for name in _EXPERT_WEIGHTS:
            param = getattr(experts, name)
            if param.shape[0] % ep_mesh.size():
                raise EngineError(f"{param.shape[0]} experts are not divisible by e{ep_mesh.size()}")
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)])
            setattr(experts, name, torch.nn.Parameter(sharded, requires_grad=param.requires_grad))
        experts.dispatcher = dispatcher
        changed += 1
    return changed


def apply_context_parallel(model: torch.nn.Module, cp_group: object) -> None:
    """Give every attention the context-parallel group (Ulysses over heads inside the model)."""
    for layer in _layers(model):
        layer.self_attn.cp_group = cp_group


def apply_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute every layer's activations in the backward (non-reentrant ``torch.utils.checkpoint``):
    the forward keeps only each layer's input. The layer's ``forward`` is replaced on the instance,
    so FSDP2's hooks and the parameter names are untouched."""
    import functools

    from torch.utils.checkpoint import checkpoint

    def run(forward: Any, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    for layer in _layers(model):
        layer.forward = functools.partial(run, layer.forward)


def compile_pointwise(model: torch.nn.Module) -> list[str]:
    """``torch.compile`` (dynamic shapes) the element-wise modules of every layer: the norms (q/k
    norms too) and the dense or shared-expert MLP; the attention kernel, the router and the expert
    dispatch stay eager. Returns the compiled modules' names."""
    from areal_tasks.models.compile import length_agnostic_options

    compiled = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        pointwise = leaf in ("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm", "norm")
        dense_mlp = leaf in ("mlp", "shared_expert") and not _is_moe(module)
        if pointwise or dense_mlp:
            module.compile(dynamic=True, options=length_agnostic_options())
            compiled.append(name)
    return compiled


def apply_fsdp(
    model: torch.nn.Module,
    mesh: ArchonMesh,
    *,
    param_dtype: torch.dtype | None,
    cpu_offload: bool,
    experts_split: bool,
    reshard_after_forward: bool = True,
) -> None:
    """``fully_shard`` every layer (experts first, as their own unit, when split over ``ep``) and
    then the root (embedding, final norm and head) over the data-parallel ranks."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    kwargs = {"mp_policy": mp, "offload_policy": offload, "reshard_after_forward": reshard_after_forward}
    edp_mesh = mesh.expert_mesh["edp"]
    for layer in _layers(model):
        ignored: set[torch.nn.Parameter] = set()
        if experts_split and _is_moe(layer.mlp):
            if edp_mesh.size() > 1:
                fully_shard(layer.mlp.experts, mesh=edp_mesh, **kwargs)
            else:  # no replica holds these experts: nothing to shard or reduce
                ignored = set(layer.mlp.experts.parameters())
        fully_shard(layer, mesh=mesh.fsdp_mesh, ignored_params=ignored or None, **kwargs)
    root_ignored = {p for layer in _layers(model) for p in _unsharded_experts(layer, experts_split, edp_mesh)}
    fully_shard(model, mesh=mesh.fsdp_mesh, ignored_params=root_ignored or None, **kwargs)


def _unsharded_experts(layer: torch.nn.Module, experts_split: bool, edp_mesh: DeviceMesh) -> list:
    if experts_split and _is_moe(layer.mlp) and edp_mesh.size() == 1:
        return list(layer.mlp.experts.parameters())
    return []
