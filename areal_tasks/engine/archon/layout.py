"""Whether a model can run under an archon layout, checked from its HF ``config.json`` before any
process group or weight exists (torch-free).

Every problem names the model field and the layout dim that disagree: layers against pipeline
stages, attention heads and feed-forward widths against tensor parallelism, heads against context
(Ulysses) parallelism, experts against expert parallelism, and the families the engine defines.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from areal_tasks.errors import EngineError

logger = logging.getLogger(__name__)

__all__ = [
    "ARCHON_FAMILIES",
    "MOE_FAMILIES",
    "check_archon_layout",
    "layout_problems",
    "model_problems",
    "stages_per_rank",
]

#: model types the archon decoder defines.
ARCHON_FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")
MOE_FAMILIES: tuple[str, ...] = ("qwen2_moe", "qwen3_moe", "mixtral")

_INTERLEAVED = ("interleaved_1f1b",)


def stages_per_rank(schedule: str, setting: int | str) -> int:
    """The pipeline stages one rank holds for ``schedule`` (``setting``: ``auto`` or a number)."""
    if setting == "auto":
        return 2 if schedule in _INTERLEAVED else 1
    v = int(setting)
    if schedule in _INTERLEAVED and v < 2:
        raise EngineError(
            f"archon.pp_schedule={schedule} needs pp_stages_per_rank >= 2 (got {v}); use 1f1b for one stage a rank"
        )
    if schedule in ("1f1b", "gpipe") and v != 1:
        raise EngineError(
            f"archon.pp_schedule={schedule} runs one stage a rank, got pp_stages_per_rank={v}; "
            "use interleaved_1f1b for several"
        )
    return v


def _n_experts(config: Mapping[str, Any]) -> int:
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def layout_problems(
    config: Mapping[str, Any], *, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, stages_per_rank: int = 1
) -> list[str]:
    """Every reason ``config`` (an HF ``config.json`` as a dict) cannot run at this layout."""
    model_type = config.get("model_type")
    if model_type not in ARCHON_FAMILIES:
        return [f"model_type {model_type!r} is not defined by the archon engine; it runs {', '.join(ARCHON_FAMILIES)}"]
    problems = []
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    n_stages = pp * stages_per_rank
    if n_stages > 1 and layers < n_stages:
        problems.append(
            f"num_hidden_layers={layers} cannot fill {n_stages} pipeline stages (p{pp} x {stages_per_rank} a rank); "
            "every stage needs a layer: lower p or archon.pp_stages_per_rank"
        )
    if tp > 1:
        for field, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
            if value % tp:
                problems.append(f"{field}={value} is not divisible by tensor parallelism t{tp}")
        width = config.get("intermediate_size")
        if width and not (model_type in MOE_FAMILIES and _all_moe(config)) and int(width) % tp:
            problems.append(f"intermediate_size={width} is not divisible by tensor parallelism t{tp}")
        shared = config.get("shared_expert_intermediate_size")
        if shared and int(shared) % tp:
            problems.append(f"shared_expert_intermediate_size={shared} is not divisible by tensor parallelism t{tp}")
    if cp > 1 and (heads // tp) % cp:
        problems.append(
            f"num_attention_heads={heads} / t{tp} = {heads // max(tp, 1)} heads a rank is not divisible by "
            f"context parallelism c{cp} (Ulysses splits heads)"
        )
    if ep > 1:
        experts = _n_experts(config)
        if model_type not in MOE_FAMILIES or experts == 0:
            problems.append(f"expert parallelism e{ep} needs a MoE model; {model_type} has no experts: drop e")
        elif experts % ep:
            field = "num_local_experts" if model_type == "mixtral" else "num_experts"
            problems.append(f"{field}={experts} is not divisible by expert parallelism e{ep}")
    return problems


def _all_moe(config: Mapping[str, Any]) -> bool:
    """Whether every layer is a MoE layer (then ``intermediate_size`` is unused)."""
    if config.get("model_type") == "mixtral":
        return True
    step = int(config.get("decoder_sparse_step") or 1)
    return step == 1 and not config.get("mlp_only_layers")


def check_archon_layout(
    config: Mapping[str, Any], *, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, stages_per_rank: int = 1
) -> None:
    """Raise EngineError listing every :func:`layout_problems` (nothing when the layout fits)."""
    problems = layout_problems(config, tp=tp, pp=pp, cp=cp, ep=ep, stages_per_rank=stages_per_rank)
    if problems:
        name = config.get("_name_or_path") or config.get("model_type")
        raise EngineError(f"the archon engine cannot run {name} at this layout: " + "; ".join(problems))


def model_problems(config: Mapping[str, Any], dims: Any, engine_config: Any) -> list[str]:
    """:func:`layout_problems` of an engine section (``EngineConfig``) at ``dims`` (``ParallelDims``):
    what the engine registry asks before a job starts."""
    archon = engine_config.archon
    try:
        v = stages_per_rank(archon.pp_schedule, archon.pp_stages_per_rank) if dims.pp > 1 else 1
    except EngineError as exc:
        return [str(exc)]
    return layout_problems(config, tp=dims.tp, pp=dims.pp, cp=dims.sp, ep=dims.ep, stages_per_rank=v)
