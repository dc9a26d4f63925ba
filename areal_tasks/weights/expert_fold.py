"""Per-expert checkpoint tensors folded into a served model's stacked expert weights.

HF checkpoints of MoE models store each expert apart: Qwen-style ones (qwen2_moe, qwen3_moe,
deepseek, ...) as ``<layer>.mlp.experts.<e>.{gate,up,down}_proj.weight``, mixtral as
``<layer>.block_sparse_moe.experts.<e>.{w1,w3,w2}.weight`` (its router as
``<layer>.block_sparse_moe.gate.weight``). transformers 5 holds them stacked in the module
(``<layer>.mlp.experts.gate_up_proj`` of shape ``[E, 2I, H]``, gate rows first, and
``<layer>.mlp.experts.down_proj`` of shape ``[E, H, I]``; mixtral's ``block_sparse_moe`` renamed
``mlp``) and converts on ``from_pretrained``. A weight update in the checkpoint's names (the archon
engine publishes those, as vLLM and SGLang load them) never goes through that conversion, so the
embedded server's receivers fold them here, exactly as transformers does, before checking the
update against the served model. This module is the one place that knows that mapping.

:class:`ExpertFold` folds one update as it arrives in parts (the buckets of a collective update
may each hold some experts of a layer): it keeps the experts of every stacked weight until all
are there, hands the stacked tensor out with the part that completes it, and
:meth:`ExpertFold.finish` refuses an update that ended with a stacked weight incomplete, naming
the missing experts. :func:`fold_expert_tensors` folds a whole update at once (disk, shared).

Names the served model has as they are, and per-expert names whose stacked weight it lacks, pass
through unchanged for the served-model check to report. Torch is imported inside functions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from areal_tasks.errors import WeightTransportError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["ExpertFold", "fold_expert_tensors"]

_PER_EXPERT = re.compile(
    r"^(?P<module>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
#: checkpoint projection -> (served stacked weight, its part, parts): gate rows before up rows
_PARTS: dict[str, tuple[str, int, int]] = {
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
    "down_proj": ("down_proj", 0, 1),
    "w1": ("gate_up_proj", 0, 2),
    "w3": ("gate_up_proj", 1, 2),
    "w2": ("down_proj", 0, 1),
}
#: (checkpoint, served) module-name renames transformers applies on load (mixtral's MoE block)
_RENAMES = ((".block_sparse_moe.", ".mlp."),)

#: served name -> (shape, dtype), as :class:`~areal_tasks.weights.base.ServedWeights` holds them
SpecMap = Mapping[str, tuple[tuple[int, ...], object]]


def _renamed(name: str, specs: SpecMap) -> str:
    """``name`` as the served model calls it: itself when served, else after a rename that makes
    it a served name (mixtral's ``block_sparse_moe.gate.weight`` -> ``mlp.gate.weight``)."""
    if name in specs:
        return name
    for old, new in _RENAMES:
        candidate = name.replace(old, new)
        if candidate != name and candidate in specs:
            return candidate
    return name


@dataclass
class _Stack:
    """The experts of one served stacked weight received so far (``parts`` tensors each)."""

    n_experts: int
    n_parts: int
    #: expert -> part -> (checkpoint name, tensor)
    got: dict[int, dict[int, tuple[str, torch.Tensor]]] = field(default_factory=dict)

    def complete(self, expert: int) -> bool:
        return len(self.got.get(expert, {})) == self.n_parts

    def done(self) -> bool:
        return len(self.got) == self.n_experts and all(self.complete(e) for e in self.got)

    def stacked(self) -> torch.Tensor:
        import torch

        rows = []
        for e in range(self.n_experts):
            parts = [self.got[e][p][1] for p in range(self.n_parts)]
            rows.append(torch.cat(parts, dim=0) if len(parts) > 1 else parts[0])
        return torch.stack(rows)


class ExpertFold:
    """Folds the per-expert tensors of one update, part by part, into ``specs``' stacked weights
    (see the module doc). One instance per update."""

    def __init__(self, specs: SpecMap) -> None:
        self.specs = specs
        self._pending: dict[str, _Stack] = {}
        #: the projection names by part of every pending stacked weight (for the error message)
        self._proj_names: dict[str, dict[int, str]] = {}

    def add(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``named`` in the served model's names: per-expert tensors are kept until their stacked
        weight is complete and then come out as it; every other tensor passes through (renamed
        where transformers renames it). Raises :class:`WeightTransportError` for an expert index
        out of the served range, an expert given twice, or a name given both ways."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in named.items():
            match = _PER_EXPERT.match(name)
            served = self._stacked_name(match) if match is not None and name not in self.specs else None
            if served is None:
                self._put(out, _renamed(name, self.specs), tensor, name)
                continue
            assert match is not None
            _, part, n_parts = _PARTS[match["proj"]]
            n_experts = self.specs[served][0][0]
            expert = int(match["e"])
            if expert >= n_experts:
                raise WeightTransportError(
                    f"{name}: expert {expert} is out of range, the served model has {n_experts} experts"
                )
            stack = self._pending.setdefault(served, _Stack(n_experts, n_parts))
            slot = stack.got.setdefault(expert, {})
            if part in slot:
                raise WeightTransportError(f"{served}: expert {expert} is given twice ({slot[part][0]} and {name})")
            slot[part] = (name, tensor)
            self._proj_names.setdefault(served, {})[part] = match["proj"]
            if stack.done():
                self._put(out, served, stack.stacked(), name)
                del self._pending[served]
        return out

    def finish(self) -> None:
        """Raise :class:`WeightTransportError` when a stacked weight is still incomplete, naming
        its missing experts (and parts); the fold is empty afterwards either way."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        problems = []
        for served, stack in sorted(pending.items()):
            complete = [e for e in range(stack.n_experts) if stack.complete(e)]
            names = self._proj_names.get(served, {})
            projs = _projections(served, names)
            missing = []
            for e in range(stack.n_experts):
                if not stack.complete(e):
                    lacking = [projs[p] for p in range(stack.n_parts) if p not in stack.got.get(e, {})]
                    missing.append(f"{e} ({', '.join(lacking)})")
            problems.append(
                f"{served}: the served model has {stack.n_experts} experts, the update has {complete}; "
                f"missing experts {', '.join(missing)}"
            )
        raise WeightTransportError("the update ended with experts missing: " + "; ".join(problems))

    @property
    def pending(self) -> list[str]:
        """The stacked weights still waiting for experts."""
        return sorted(self._pending)

    def _stacked_name(self, match: re.Match[str]) -> str | None:
        """The served stacked weight a per-expert name belongs to, or None when not served."""
        target = _PARTS[match["proj"]][0]
        served = _renamed(f"{match['module']}.experts.{target}", self.specs)
        return served if served in self.specs else None

    @staticmethod
    def _put(out: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, given: str) -> None:
        if name in out:
            raise WeightTransportError(f"{name} is given twice in one part of the update (the second as {given})")
        out[name] = tensor


def _projections(served: str, seen: Mapping[int, str]) -> list[str]:
    """Names of the parts of ``served`` (those seen, else the Qwen names) for messages."""
    qwen = ["gate_proj", "up_proj"] if served.endswith("gate_up_proj") else ["down_proj"]
    return [seen.get(p, qwen[p]) for p in range(len(qwen))]


def fold_expert_tensors(named: Mapping[str, torch.Tensor], specs: SpecMap) -> dict[str, torch.Tensor]:
    """A whole update in the served model's names (:class:`ExpertFold` of one part, finished):
    raises :class:`WeightTransportError` when a stacked weight's experts are incomplete."""
    fold = ExpertFold(specs)
    out = fold.add(named)
    fold.finish()
    return out
