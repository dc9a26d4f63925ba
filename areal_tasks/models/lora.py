"""LoRA: which modules to adapt per family, and a ``peft.LoraConfig`` built from a few numbers.

Dense families adapt all attention and MLP projections (the usual recipe that matches full
fine-tuning best). MoE families adapt attention only by default: their routed experts are stored
as fused 3-D expert tensors (not ``nn.Linear`` modules a LoRA adapter can wrap), a per-expert
adapter multiplies adapter memory by the expert count, and adapting the router destabilises
routing. Pass ``target_modules`` explicitly to go further (e.g. a Qwen2-MoE shared expert's
``gate_proj``/``up_proj``/``down_proj``).
"""

from __future__ import annotations

from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.families import FAMILIES, canonical_family, traits

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
#: DeepSeek latent attention (q_proj exists instead of q_a/q_b when q_lora_rank is null)
MLA = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


def lora_target_modules(family: str) -> list[str]:
    """Module names (suffixes, as peft matches them) to adapt for ``family``.

    ``family`` may also be a transformers ``model_type`` (``model.config.model_type``).
    Vision-language families return their language model's targets.
    """
    family = canonical_family(family)
    if family not in FAMILIES:
        raise ModelError(
            f"no default LoRA targets for model family {family!r} (known: {', '.join(sorted(FAMILIES))}); "
            "pass target_modules explicitly, e.g. ['q_proj', 'k_proj', 'v_proj', 'o_proj']"
        )
    family_traits = traits(family)
    if family_traits.attention == "mla":
        return list(MLA)
    if family_traits.is_moe:
        return list(ATTENTION)
    return ATTENTION + MLP


def build_lora_config(
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | None,
    family: str,
) -> Any:
    """A ``peft.LoraConfig`` for a causal LM; ``target_modules`` None means the family defaults."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ModelError(f"lora rank={rank!r} must be a positive integer (e.g. 16)")
    if alpha <= 0:
        raise ModelError(f"lora alpha={alpha!r} must be positive (commonly 2 x rank)")
    if not 0.0 <= dropout < 1.0:
        raise ModelError(f"lora dropout={dropout!r} must be in [0, 1)")
    targets = list(target_modules) if target_modules is not None else lora_target_modules(family)
    if not targets:
        raise ModelError("lora target_modules is empty; pass module names or None for the family defaults")
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
