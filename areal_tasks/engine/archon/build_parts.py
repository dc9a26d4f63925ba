"""Build this rank's share of an archon model: check the layout against the HF config, build the
decoder, keep this rank's pipeline stages, parallelise each stage module.

The whole decoder is built from the HF checkpoint on every rank first (on the host for a model
that fits; the stages it does not own are then dropped), so each stage starts from the same weights
the single-process model has. The order and full shapes of every parameter are recorded before
anything is sharded: the weight export walks them in that order on every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.engine.archon.layout import check_archon_layout, stages_per_rank
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.archon.model.args import ArchonArgs
    from areal_tasks.engine.archon.parallel.mesh import ArchonMesh
    from areal_tasks.engine.archon.pipeline.stages import StagePlan

logger = logging.getLogger(__name__)

__all__ = ["BuiltParts", "build_parts", "hf_config_for"]


@dataclass
class BuiltParts:
    """This rank's stage modules and what the engine needs to know about the whole model."""

    args: ArchonArgs
    hf_config: Any
    #: this rank's stage modules (the whole decoder without pipeline parallelism), parallelised.
    parts: list[torch.nn.Module]
    #: the stage index of each part.
    stage_ids: list[int]
    #: the pipeline's stages and their ranks (None without pipeline parallelism).
    plan: StagePlan | None
    #: ``(archon name, full shape)`` of every parameter of the whole model, in export order.
    weight_order: list[tuple[str, tuple[int, ...]]]
    #: archon name -> the pipeline rank that holds it.
    owner_of: dict[str, int]
    n_experts: int
    n_moe_layers: int
    aux_coef: float
    partial_grad_modules: list[torch.nn.Module] = field(default_factory=list)
    #: which compile, expert-kernel and recompute paths the engine runs (logs and benchmarks)
    kernels: dict[str, str] = field(default_factory=dict)
    #: one rank without FSDP: the flat fp32 master and compute-dtype buffers (``fsdp/flat_params.py``)
    flat: Any = None


def hf_config_for(model_path: str, role: str) -> Any:
    """The model's ``transformers`` config; a critic's says one label (the token-classification head
    the FSDP engine's critics export)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    if role == "critic":
        config.num_labels = 1
        config.classifier_dropout = 0.0
        arch = (config.architectures or [type(config).__name__.removesuffix("Config") + "ForCausalLM"])[0]
        config.architectures = [arch.replace("ForCausalLM", "ForTokenClassification")]
    return config


def _aux_coef(setting: float | str, hf_config: Any) -> float:
    if setting != "auto":
        return float(setting)
    if getattr(hf_config, "output_router_logits", False):
        return float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0)
    return 0.0


def build_parts(
    config: EngineConfig, model_path: str, mesh: ArchonMesh, device: torch.device, *, role: str
) -> BuiltParts:
    """The parallelised stage modules of this rank (see the module docstring)."""
    import torch

    from areal_tasks.engine.archon.model.build import build_decoder
    from areal_tasks.engine.archon.parallel import apply
    from areal_tasks.engine.fsdp.build import compute_dtype_name
    from areal_tasks.engine.fsdp.compile import should_compile

    dims = mesh.dims
    archon = config.archon
    v = stages_per_rank(archon.pp_schedule, archon.pp_stages_per_rank) if dims.pp > 1 else 1
    hf_config = hf_config_for(model_path, role)
    check_archon_layout(hf_config.to_dict(), tp=dims.tp, pp=dims.pp, cp=dims.sp, ep=dims.ep, stages_per_rank=v)
    model, args = build_decoder(model_path, role=role, device=device, dtype=torch.float32)
    for module in model.modules():
        if hasattr(module, "kernel") and hasattr(module, "dispatcher"):
            module.kernel = archon.moe_kernel
    weight_order = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    plan = None
    if dims.pp > 1:
        from areal_tasks.engine.archon.pipeline.schedule import schedule_spec
        from areal_tasks.engine.archon.pipeline.split import balanced_split
        from areal_tasks.engine.archon.pipeline.stages import build_stage_modules, make_plan

        spec = schedule_spec(archon.pp_schedule, v)
        plan = make_plan(balanced_split(args, dims.pp * v, archon.pp_balance), dims.pp, spec.placement)
        staged = build_stage_modules(model, plan, mesh.pp_rank, in_place=v == 1)
        stage_ids, parts = [s for s, _ in staged], [m for _, m in staged]
        owner_of = _owners(weight_order, plan)
    else:
        stage_ids, parts = [0], [model]
        owner_of = dict.fromkeys((name for name, _ in weight_order), 0)
    del model
    param_dtype_name = compute_dtype_name(config.dtype, device)
    param_dtype = None if param_dtype_name == "float32" else getattr(torch, param_dtype_name)
    partial: list[torch.nn.Module] = []
    compile_on, compile_reason = should_compile(config.compile, device, tp=dims.tp, lora=False)
    compiled: list[str] = []
    for part in parts:
        if dims.ep > 1:
            apply.apply_expert_parallel(part, mesh)
        if dims.tp > 1:
            partial += apply.apply_tensor_parallel(part, mesh.mesh["tp"])
        if dims.sp > 1:
            apply.apply_context_parallel(part, mesh.group("cp"))
        if compile_on:
            compiled += apply.compile_pointwise(part)
        if config.gradient_checkpointing:
            apply.apply_activation_checkpointing(part)
    flat = None
    if _runs_flat(config, dims, device):
        from areal_tasks.engine.fsdp.flat_params import FlatParams

        flat = FlatParams(parts[0], param_dtype or torch.float32)
    else:
        for part in parts:
            apply.apply_fsdp(
                part, mesh, param_dtype=param_dtype, cpu_offload=config.cpu_offload, experts_split=dims.ep > 1
            )
    return BuiltParts(
        args=args,
        hf_config=hf_config,
        parts=parts,
        stage_ids=stage_ids,
        plan=plan,
        weight_order=weight_order,
        owner_of=owner_of,
        n_experts=args.n_experts if args.is_moe else 0,
        n_moe_layers=args.n_moe_layers if args.is_moe else 0,
        aux_coef=_aux_coef(archon.moe_aux_loss_coef, hf_config),
        partial_grad_modules=partial,
        kernels={
            "compile": f"{len(compiled)} modules (pointwise)" if compiled else f"off ({compile_reason})",
            "moe_kernel": archon.moe_kernel,
            "activation_checkpointing": str(config.gradient_checkpointing),
            "fsdp_wrap": "none (flat buffers)" if flat is not None else "block",
        },
        flat=flat,
    )


def _runs_flat(config: EngineConfig, dims: Any, device: torch.device) -> bool:
    """Whether one rank skips FSDP for the flat buffers: ``fsdp_wrap=none`` (refused with more than
    one rank or with CPU offload), or ``auto`` on one GPU (FSDP2's per-parameter host work shards
    nothing there: docs/benchmarks.md, "MoE train throughput"). ``root``/``block`` keep FSDP2."""
    one_rank = dims.world_size == 1
    if config.fsdp_wrap == "none":
        if not one_rank or config.cpu_offload:
            raise EngineError(
                "fsdp_wrap=none runs the archon engine on one rank without CPU offload; "
                f"got {dims} with cpu_offload={config.cpu_offload}: use fsdp_wrap=auto"
            )
        return True
    return config.fsdp_wrap == "auto" and one_rank and device.type == "cuda" and not config.cpu_offload


def _owners(weight_order: list[tuple[str, tuple[int, ...]]], plan: StagePlan) -> dict[str, int]:
    """archon name -> pipeline rank, from the plan's layer ranges and the first/last stage ends."""
    from areal_tasks.engine.archon.pipeline.stages import FIRST_ONLY, LAST_ONLY

    layer_stage = {layer: s for s, layers in enumerate(plan.layer_ranges) for layer in layers}
    owners = {}
    for name, _ in weight_order:
        head = name.split(".", 1)[0]
        if head == "layers":
            stage = layer_stage[int(name.split(".")[1])]
        elif head in FIRST_ONLY:
            stage = 0
        elif head in LAST_ONLY:
            stage = plan.n_stages - 1
        else:
            raise EngineError(f"cannot place parameter {name!r} on a pipeline stage")
        owners[name] = plan.rank_of(stage)
    return owners
