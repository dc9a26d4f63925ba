"""Where the pipeline stages live, and this rank's stage modules.

Placement of ``n_stages = pp x stages_per_rank`` stages on the ``pp`` ranks of a pipeline group:

* ``loop``: stage ``s`` on rank ``s % pp`` (GPipe/1F1B with one stage per rank; interleaved 1F1B,
  looped BFS and interleaved zero-bubble with several);
* ``v``: the V shape of ZBV and DualPipeV, two stages per rank: rank ``r`` holds stages ``r`` and
  ``2 pp - 1 - r`` (so rank 0 holds both the first and the last stage). For more stages per rank the
  V repeats (block ``b`` of ``pp`` stages runs down the ranks when ``b`` is even, up when odd), as in
  torch's ``generate_stage_to_rank_mapping(style="v")``.

A stage module is the decoder itself with what the stage does not run removed, so that its
parameter names are the global ones (``layers.5.self_attn.q_proj.weight``): the checkpoint, the
weight export and the optimizer see the same names with or without pipelining. The layers not owned
are deleted from the ``layers`` ModuleDict; ``embed_tokens`` is ``None`` unless the stage is the first,
``norm``/``lm_head``/``value_head`` are ``None`` unless it is the last. The decoder's forward takes
hidden states instead of token ids when it has no embedding and returns hidden states when it has
no head (see the contract of ``ArchonDecoder``).

Copies skip what they drop (``copy.deepcopy`` with the dropped submodules pre-set in its memo), so a
stage costs only its own parameters on top of the full model it is cut from; build on the meta device
and load the stage's weights by name to avoid holding the full model at all. With tied word
embeddings the first and last stage hold separate copies of the tied weight: their gradients must be
summed over the two ranks (the engine's job), or the weights drift apart.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)

#: how the stages are laid out on the ranks.
Placement = Literal["loop", "v"]
PLACEMENTS: tuple[str, ...] = ("loop", "v")

#: submodules a stage keeps only when it is the first stage.
FIRST_ONLY: tuple[str, ...] = ("embed_tokens",)
#: submodules a stage keeps only when it is the last stage.
LAST_ONLY: tuple[str, ...] = ("norm", "lm_head", "value_head")


def stage_rank(stage: int, pp: int, placement: Placement) -> int:
    """The pp rank that runs ``stage``."""
    if placement == "loop":
        return stage % pp
    if placement == "v":
        block, pos = divmod(stage, pp)
        return pos if block % 2 == 0 else pp - 1 - pos
    raise EngineError(f"pipeline placement must be one of {PLACEMENTS}, got {placement!r}")


@dataclass(frozen=True)
class StagePlan:
    """The pipeline's stages: their layers and their ranks."""

    #: pipeline-parallel degree (ranks of the pipeline group).
    pp: int
    #: the layers of every stage, in stage order (``len == pp x stages_per_rank``).
    layer_ranges: tuple[range, ...]
    placement: Placement = "loop"

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise EngineError(f"pp must be >= 1, got {self.pp}")
        if self.placement not in PLACEMENTS:
            raise EngineError(f"pipeline placement must be one of {PLACEMENTS}, got {self.placement!r}")
        n = len(self.layer_ranges)
        if n == 0 or n % self.pp != 0:
            raise EngineError(f"{n} pipeline stages cannot be spread evenly over pp={self.pp} ranks")
        if self.placement == "v" and (n // self.pp) % 2 != 0:
            raise EngineError(f"the 'v' placement needs an even number of stages per rank, got {n // self.pp}")
        if any(len(r) == 0 for r in self.layer_ranges):
            raise EngineError(f"every pipeline stage needs at least one layer, got {list(self.layer_ranges)}")
        for a, b in zip(self.layer_ranges, self.layer_ranges[1:]):
            if a.stop != b.start or a.step != 1:
                raise EngineError(f"pipeline stages must hold contiguous layers, got {list(self.layer_ranges)}")

    @property
    def n_stages(self) -> int:
        return len(self.layer_ranges)

    @property
    def stages_per_rank(self) -> int:
        return self.n_stages // self.pp

    @property
    def n_layers(self) -> int:
        return self.layer_ranges[-1].stop

    def rank_of(self, stage: int) -> int:
        """The pp rank that runs ``stage``."""
        return stage_rank(stage, self.pp, self.placement)

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages ``pp_rank`` runs, in increasing order."""
        return [s for s in range(self.n_stages) if self.rank_of(s) == pp_rank]

    @property
    def last_rank(self) -> int:
        """The pp rank of the last stage (the one that computes the loss)."""
        return self.rank_of(self.n_stages - 1)


def make_plan(layer_ranges: Sequence[range], pp: int, placement: Placement = "loop") -> StagePlan:
    """A :class:`StagePlan` from the split of :func:`~.split.split_layers`."""
    return StagePlan(pp=pp, layer_ranges=tuple(layer_ranges), placement=placement)


def stage_module(model: nn.Module, plan: StagePlan, stage: int) -> nn.Module:
    """A copy of ``model`` (an ``ArchonDecoder``-shaped module) pruned to ``stage``'s layers and ends."""
    if not 0 <= stage < plan.n_stages:
        raise EngineError(f"stage {stage} is outside the pipeline's {plan.n_stages} stages")
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) != plan.n_layers:
        raise EngineError(
            f"the model has {0 if layers is None else len(layers)} layers but the pipeline plan splits {plan.n_layers}"
        )
    keep = {str(i) for i in plan.layer_ranges[stage]}
    is_first, is_last = stage == 0, stage == plan.n_stages - 1
    dropped: list[nn.Module] = [layer for key, layer in layers.items() if key not in keep]
    dropped += [m for name in FIRST_ONLY if not is_first and (m := getattr(model, name, None)) is not None]
    dropped += [m for name in LAST_ONLY if not is_last and (m := getattr(model, name, None)) is not None]
    memo = {id(m): None for m in dropped}
    clone = copy.deepcopy(model, memo)
    _prune(clone, keep, is_first, is_last)
    return clone


def prune_in_place(model: nn.Module, plan: StagePlan, stage: int) -> nn.Module:
    """``model`` itself pruned to ``stage`` (no copy: a rank with one stage needs no full model after)."""
    _prune(model, {str(i) for i in plan.layer_ranges[stage]}, stage == 0, stage == plan.n_stages - 1)
    return model


def _prune(module: nn.Module, keep: set[str], is_first: bool, is_last: bool) -> None:
    for key in [k for k in module.layers if k not in keep]:
        del module.layers[key]
    for name in FIRST_ONLY if not is_first else ():
        if hasattr(module, name):
            setattr(module, name, None)
    for name in LAST_ONLY if not is_last else ():
        if hasattr(module, name):
            setattr(module, name, None)


def build_stage_modules(
    model: nn.Module, plan: StagePlan, pp_rank: int, *, in_place: bool = False
) -> list[tuple[int, nn.Module]]:
    """``(stage index, module)`` of every stage ``pp_rank`` runs, in increasing stage order.

    ``in_place`` (one stage per rank only) prunes ``model`` itself instead of copying it.
    """
    stages = plan.stages_of(pp_rank)
    if not stages:
        raise EngineError(f"pp rank {pp_rank} runs no stage of a {plan.pp}-rank pipeline")
    if in_place:
        if len(stages) != 1:
            raise EngineError(f"in_place pruning needs one stage per rank, rank {pp_rank} runs {stages}")
        return [(stages[0], prune_in_place(model, plan, stages[0]))]
    return [(s, stage_module(model, plan, s)) for s in stages]
