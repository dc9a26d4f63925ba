"""Per-expert checkpoint tensors folded into a served model's stacked expert weights.

HF checkpoints of Qwen-style MoE models (qwen2_moe, qwen3_moe, deepseek, ...) store each expert
apart: ``<layer>.mlp.experts.<e>.{gate,up,down}_proj.weight``. transformers 5 holds them stacked
in the module (``<layer>.mlp.experts.gate_up_proj`` of shape ``[E, 2I, H]``, gate rows first, and
``<layer>.mlp.experts.down_proj`` of shape ``[E, H, I]``) and converts on ``from_pretrained``. A
weight update in the checkpoint's names (the archon engine publishes those, as vLLM loads them)
never goes through that conversion, so a receiver of the embedded server folds them here, exactly
as transformers does, before checking the update against the served model.

Only served stacked weights whose per-expert parts are all present are folded; anything else is
left as it came, for the served-model check to report. Torch is imported inside the function.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from areal_tasks.errors import WeightTransportError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["fold_expert_tensors"]

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def fold_expert_tensors(
    named: Mapping[str, torch.Tensor], specs: Mapping[str, tuple[tuple[int, ...], object]]
) -> dict[str, torch.Tensor]:
    """``named`` with every complete set of per-expert tensors stacked into the served
    ``<prefix>.gate_up_proj`` / ``<prefix>.down_proj`` (only where ``specs`` has that name and no
    tensor of ``named`` already carries it). Raises :class:`WeightTransportError` when an expert
    index is out of the served range."""
    import torch

    groups: dict[tuple[str, str], dict[int, str]] = {}
    for name in named:
        match = _PER_EXPERT.match(name)
        if match is None or name in specs:
            continue
        groups.setdefault((match["prefix"], match["proj"]), {})[int(match["e"])] = name
    if not groups:
        return dict(named)
    out = dict(named)
    for prefix in sorted({p for p, _ in groups}):
        for target, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            served = f"{prefix}.{target}"
            if served not in specs or served in named or any((prefix, p) not in groups for p in parts):
                continue
            n_experts = specs[served][0][0]
            by_proj = [groups[(prefix, p)] for p in parts]
            if any(sorted(g) != list(range(n_experts)) for g in by_proj):
                found = sorted({e for g in by_proj for e in g})
                raise WeightTransportError(
                    f"{served}: the served model has {n_experts} experts, the update has {found}"
                )
            stacked = [
                torch.cat([named[g[e]] for g in by_proj], dim=0) if len(by_proj) > 1 else named[by_proj[0][e]]
                for e in range(n_experts)
            ]
            out[served] = torch.stack(stacked)
            for g in by_proj:
                for name in g.values():
                    out.pop(name)
    return out
