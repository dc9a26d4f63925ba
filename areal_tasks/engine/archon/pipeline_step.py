"""The archon engine's side of a pipelined step: its micro-batches, loss and MoE load-balancing
loss through the :class:`~areal_tasks.engine.archon.pipeline.runner.PipelineRunner`.

The runner hands the last stage's per-token outputs and, for a MoE model, the summed routing
statistics (``moe_aux``, carried through the stages with the activations) to the loss; here the
statistics become HF's load-balancing loss of the micro-batch before the engine's loss sees them.
The runner broadcasts every micro-batch's loss and stats to all pipeline ranks, so each rank
returns the same step stats.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import INPUT_IDS
from areal_tasks.engine.archon.forward import AUX_LOSS_KEY, aux_loss_of
from areal_tasks.engine.fsdp.step_stats import WeightedSums

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.train_engine import Batch, LossFn
    from areal_tasks.engine.archon.build_parts import BuiltParts
    from areal_tasks.engine.archon.engine import ArchonEngine
    from areal_tasks.engine.archon.forward import HeadSpec
    from areal_tasks.engine.archon.pipeline.runner import PipelineRunner

logger = logging.getLogger(__name__)

__all__ = ["PipelinedSteps", "build_pipeline"]

_RUNNER_AUX_KEY = "moe_aux"


class PipelinedSteps:
    """Training and forward passes of one engine through its pipeline runner."""

    def __init__(self, runner: PipelineRunner, spec: HeadSpec) -> None:
        self.runner = runner
        self.spec = spec

    def run(
        self,
        micro_batches: list[Batch],
        bounds: Sequence[tuple[int, ...]],
        loss_fn: LossFn,
        weights: list[float],
        total_weight: float,
        *,
        grad_scale: float,
        backward: bool,
    ) -> WeightedSums:
        """Forward (and backward) of every micro-batch; the weighted sums of their losses and stats."""

        def with_aux(outputs: dict[str, torch.Tensor], mb: Batch) -> tuple[torch.Tensor, Any]:
            aux = outputs.pop(_RUNNER_AUX_KEY, None)
            if aux is not None and self.spec.n_experts:
                outputs[AUX_LOSS_KEY] = aux_loss_of(aux, int(mb[INPUT_IDS].numel()), self.spec)
            return loss_fn(outputs, mb)

        result = self.runner.run(
            micro_batches, with_aux, weights, total_weight, backward=backward, grad_scale=grad_scale
        )
        sums = WeightedSums()
        for values, weight in zip(result.per_mb, weights):
            if values is not None and weight > 0:
                sums.add(values, weight)
        return sums

    def forward(
        self, micro_batches: list[Batch], bounds: Sequence[tuple[int, ...]], *, with_entropy: bool
    ) -> list[dict[str, torch.Tensor]]:
        """Per-token outputs of every micro-batch, on every pipeline rank."""
        return self.runner.forward(micro_batches, with_entropy=with_entropy)


def build_pipeline(engine: ArchonEngine, built: BuiltParts) -> PipelinedSteps:
    """The runner over this rank's stage modules, with the engine's schedule and head."""
    import torch

    from areal_tasks.engine.archon.pipeline.runner import PipelineRunner
    from areal_tasks.engine.archon.pipeline.schedule import StageIO
    from areal_tasks.engine.fsdp.build import compute_dtype_name

    dtype = getattr(torch, compute_dtype_name(engine.config.dtype, engine.device))
    io = StageIO(hidden_size=built.args.hidden_size, dtype=dtype, n_experts=built.n_experts, role=engine.role)
    runner = PipelineRunner(
        list(zip(built.stage_ids, built.parts)),
        built.plan,
        schedule=engine.config.archon.pp_schedule,
        io=io,
        device=engine.device,
        pp_group=engine.mesh.group("pp"),
        temperature=engine.temperature,
        grad_entropy=engine.grad_entropy,
        pad_to_multiple_of=max(engine.config.micro_batch.pad_to_multiple_of, 8),
        cp_group=engine.mesh.group("cp") if engine.mesh.dims.sp > 1 else None,
    )
    return PipelinedSteps(runner, engine.spec)
