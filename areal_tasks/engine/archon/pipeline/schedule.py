"""Pipeline schedules by name, the micro-batch counts they accept, and the static stage shapes.

Names -> ``torch.distributed.pipelining`` classes (torch >= 2.13):

========================  ==================================  =========  ================
name                      torch class                         placement  stages per rank
========================  ==================================  =========  ================
``gpipe``                 ``ScheduleGPipe``                   loop       1
``1f1b``                  ``Schedule1F1B``                    loop       1
``interleaved_1f1b``      ``ScheduleInterleaved1F1B``         loop       >= 2
``looped_bfs``            ``ScheduleLoopedBFS``               loop       >= 2
``interleaved_zb``        ``ScheduleInterleavedZeroBubble``   loop       >= 2
``zbv``                   ``ScheduleZBVZeroBubble``           v          2
``dualpipev``             ``ScheduleDualPipeV``               v          2
========================  ==================================  =========  ================

Every schedule is built with ``scale_grads=False``: torch would otherwise divide the gradients by the
number of micro-batches after the last backward; our loss is already scaled by
``weight / total_weight`` per micro-batch (the engine's loss contract), so nothing may divide again.

Micro-batch counts: 1F1B and DualPipeV need at least as many micro-batches as stages, the interleaved
schedules a count that is a multiple of ``max(1, n // pp)``, ZBV at least ``2 pp - 1``.
:func:`micro_batch_count` returns the smallest count >= ``n`` a schedule takes; the runner makes up
the difference with empty micro-batches of weight 0.

Stage shapes are given to torch up front (``PipelineStage(input_args=..., output_args=...)``, its
"static" mode): torch's dynamic mode would run a real forward and backward of the first micro-batch
(and call the loss function on it) to discover them at every new shape. Static shapes depend on the
padded micro-batch length, so the runner builds new stage and schedule objects when it changes
(cheap: no module is copied; see ``runner.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule's torch class and what it needs."""

    name: str
    #: attribute of ``torch.distributed.pipelining``.
    torch_class: str
    placement: Literal["loop", "v"]
    #: one stage per rank (``PipelineScheduleSingle``) or a list of stages (``PipelineScheduleMulti``).
    single: bool
    #: stages per rank the schedule requires (None: any >= 2 for a multi-stage schedule).
    stages_per_rank: int | None


SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec("gpipe", "ScheduleGPipe", "loop", True, 1),
        ScheduleSpec("1f1b", "Schedule1F1B", "loop", True, 1),
        ScheduleSpec("interleaved_1f1b", "ScheduleInterleaved1F1B", "loop", False, None),
        ScheduleSpec("looped_bfs", "ScheduleLoopedBFS", "loop", False, None),
        ScheduleSpec("interleaved_zb", "ScheduleInterleavedZeroBubble", "loop", False, None),
        ScheduleSpec("zbv", "ScheduleZBVZeroBubble", "v", False, 2),
        ScheduleSpec("dualpipev", "ScheduleDualPipeV", "v", False, 2),
    )
}


def schedule_spec(name: str, stages_per_rank: int | None = None) -> ScheduleSpec:
    """The :class:`ScheduleSpec` of ``name``; checks ``stages_per_rank`` against it when given."""
    spec = SCHEDULES.get(name)
    if spec is None:
        raise EngineError(f"unknown pipeline schedule {name!r}; known: {sorted(SCHEDULES)}")
    import torch.distributed.pipelining as pipelining

    if not hasattr(pipelining, spec.torch_class):
        raise EngineError(f"pipeline schedule {name!r} needs torch's {spec.torch_class}, absent from this torch")
    if stages_per_rank is not None:
        if spec.single and stages_per_rank != 1:
            raise EngineError(
                f"pipeline schedule {name!r} runs one stage per rank, got stages_per_rank={stages_per_rank}"
            )
        if spec.stages_per_rank is not None and stages_per_rank != spec.stages_per_rank:
            raise EngineError(
                f"pipeline schedule {name!r} needs stages_per_rank={spec.stages_per_rank}, got {stages_per_rank}"
            )
        if not spec.single and spec.stages_per_rank is None and stages_per_rank < 2:
            raise EngineError(
                f"pipeline schedule {name!r} interleaves several stages per rank: stages_per_rank must be >= 2, "
                f"got {stages_per_rank} (use '1f1b' or 'gpipe' for one)"
            )
    return spec


def micro_batch_count(name: str, n: int, pp: int, n_stages: int) -> int:
    """The smallest number of micro-batches >= ``n`` that schedule ``name`` accepts."""
    if n < 1:
        raise EngineError(f"a pipeline step needs at least one micro-batch, got {n}")
    if name in ("1f1b", "dualpipev"):
        return max(n, n_stages)
    if name == "zbv":
        return max(n, 2 * pp - 1)
    if name in ("interleaved_1f1b", "interleaved_zb"):
        while n % max(1, n // pp) != 0:
            n += 1
        return n
    return n


def build_schedule(spec: ScheduleSpec, stages: list[Any], n_microbatches: int, loss_fn: Any | None) -> Any:
    """The torch schedule over this rank's ``PipelineStage`` objects, never dividing the gradients."""
    import torch.distributed.pipelining as pipelining

    cls = getattr(pipelining, spec.torch_class)
    if spec.single:
        return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)


@dataclass(frozen=True)
class StageIO:
    """What travels between stages: the hidden states ``[1, T, hidden_size]`` in ``dtype`` and, for MoE
    models (``n_experts > 0``), the auxiliary sums ``[2, n_experts]`` float32; what the last stage
    returns: ``[1, T, 2]`` log-prob/entropy (actor) or ``[1, T, 1]`` values (critic), float32."""

    hidden_size: int
    dtype: torch.dtype
    n_experts: int = 0
    role: Literal["actor", "critic"] = "actor"

    def example_args(self, stage: int, n_stages: int, length: int) -> tuple[Any, Any]:
        """Meta-device ``(input_args, output_args)`` of ``stage`` for micro-batches of ``length`` tokens."""
        import torch

        meta = torch.device("meta")

        def hidden() -> torch.Tensor:
            return torch.empty(1, length, self.hidden_size, dtype=self.dtype, device=meta, requires_grad=True)

        def aux() -> tuple[torch.Tensor, ...]:
            if not self.n_experts:
                return ()
            return (torch.empty(2, self.n_experts, dtype=torch.float32, device=meta, requires_grad=True),)

        if stage == 0:
            inputs: tuple[torch.Tensor, ...] = (torch.empty(1, length, dtype=torch.long, device=meta),)
        else:
            inputs = (hidden(), *aux())
        if stage == n_stages - 1:
            width = 2 if self.role == "actor" else 1
            head = torch.empty(1, length, width, dtype=torch.float32, device=meta, requires_grad=True)
            outputs: tuple[torch.Tensor, ...] = (head, *aux())
        else:
            outputs = (hidden(), *aux())
        return inputs, outputs
