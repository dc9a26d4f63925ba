"""``PipelineRunner``: our packed micro-batches through a torch pipeline schedule, with the engine's
loss contract, and a forward-only pass for log-prob/value forwards.

Training (``run(..., backward=True)``): the micro-batches are padded to one length
(``padding.py``), the token ids stacked to ``[n_mb, T_pad]`` and handed to the first stage; every
stage gets a ``pp_mb_index`` keyword tensor, and a forward pre-hook on each stage module turns it into
the decoder's keyword arguments for that micro-batch (positions, ``cu_seqlens``, host bounds, labels
on the last stage, ``aux``/``token_mask`` for MoE). The hook keeps the stage module itself as the
``PipelineStage``'s module (so FSDP-wrapped stages are seen as such by torch's schedules and parameter
names stay global). On the last stage torch calls our loss with the micro-batch's index as its
"target": we build the per-token outputs, call the caller's ``loss_fn(outputs, mb)`` and return
``loss * weight / total_weight * grad_scale`` for torch to backpropagate; the schedules are built with
``scale_grads=False``, so nothing divides afterwards. A micro-batch of weight 0 (and one the schedule
needed beyond the batch's) backpropagates ``0 * sum(outputs)``: no loss call, no contribution.

The per-micro-batch losses and stats are read on the last stage's rank and broadcast over the pp
group, so every pp rank returns the same :class:`PipelineStepResult`.

Forward only (``forward``, and ``run(..., backward=False)``): no torch schedule and no backward; each
rank runs its stages in increasing order, every micro-batch through a stage before the next stage
(sends are asynchronous, so any placement works and any micro-batch count is fine). The last stage's
per-token outputs are broadcast to every pp rank.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from areal_tasks.engine.archon.pipeline.forward_only import broadcast_outputs, forward_pass
from areal_tasks.engine.archon.pipeline.padding import (
    PaddedMicroBatch,
    pad_micro_batches,
    padded_length,
    per_token_outputs,
    stage_kwargs,
)
from areal_tasks.engine.archon.pipeline.schedule import (
    StageIO,
    build_schedule,
    micro_batch_count,
    schedule_spec,
)
from areal_tasks.engine.archon.pipeline.stages import StagePlan
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

#: the keyword tensor that tells a stage which micro-batch it runs.
MB_INDEX_KWARG = "pp_mb_index"

LossFn = Callable[[dict[str, "torch.Tensor"], dict[str, "torch.Tensor"]], tuple["torch.Tensor", Any]]


@dataclass
class PipelineStepResult:
    """The losses and stats of one pipeline step, the same on every pp rank."""

    #: per micro-batch: ``{"loss": ..., **stats}`` as floats; None for a micro-batch of weight 0.
    per_mb: list[dict[str, float] | None] = field(default_factory=list)

    def weighted_sums(self, weights: Sequence[float]) -> dict[str, float]:
        """``sum_k weights[k] * value_k`` of every key (divide by the total weight for the mean)."""
        sums: dict[str, float] = {}
        for values, weight in zip(self.per_mb, weights):
            for key, value in (values or {}).items():
                sums[key] = sums.get(key, 0.0) + value * weight
        return sums


@dataclass
class _Step:
    loss_fn: LossFn
    weights: list[float]
    total_weight: float
    grad_scale: float
    recorded: dict[int, tuple[Any, Any]] = field(default_factory=dict)


class ContiguousGrad(torch.autograd.Function):
    """Identity forward; the gradient made contiguous on the way back.

    The zero-bubble schedules compute a stage's input gradients with ``torch.autograd.grad``, which can
    hand back an expanded (non-contiguous) view (the backward of a sum, say); torch sends it as it is
    and the process group refuses it ("input tensor has to be contiguous"). Applied to the received
    activations that need a gradient; free when the gradient is contiguous already.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def contiguous_grad(t: Any) -> Any:
    """``t`` through :class:`ContiguousGrad` when it needs a gradient, else ``t`` itself."""
    return ContiguousGrad.apply(t) if isinstance(t, torch.Tensor) and t.requires_grad else t


class PipelineRunner:
    """Runs this pp rank's stages of a pipeline over packed micro-batches."""

    def __init__(
        self,
        stages: Sequence[tuple[int, nn.Module]],
        plan: StagePlan,
        *,
        schedule: str,
        io: StageIO,
        device: torch.device,
        pp_group: ProcessGroup | None = None,
        temperature: float = 1.0,
        grad_entropy: bool = False,
        pad_to_multiple_of: int = 1,
        cache_size: int = 2,
        cp_group: ProcessGroup | None = None,
    ) -> None:
        """``stages``: ``(stage index, module)`` of this rank (``stages.build_stage_modules``);
        ``pp_group``: the pipeline's process group (None: the default group); ``pad_to_multiple_of``:
        round the padded length up (fewer distinct lengths, fewer rebuilt stage objects);
        ``cache_size``: how many (micro-batch count, length) schedule builds to keep; ``cp_group``:
        the context-parallel group (each rank runs its slice of every micro-batch's tokens)."""
        import torch.distributed as dist

        self.spec = schedule_spec(schedule, plan.stages_per_rank)
        if self.spec.placement != plan.placement:
            raise EngineError(
                f"pipeline schedule {schedule!r} needs the {self.spec.placement!r} placement, "
                f"the plan uses {plan.placement!r}"
            )
        self.plan, self.io, self.device, self.group = plan, io, device, pp_group
        self.pp_rank = dist.get_rank(pp_group)
        if dist.get_world_size(pp_group) != plan.pp:
            raise EngineError(f"the pp group has {dist.get_world_size(pp_group)} ranks, the plan {plan.pp}")
        expected = plan.stages_of(self.pp_rank)
        if [s for s, _ in stages] != expected:
            raise EngineError(f"pp rank {self.pp_rank} must hold stages {expected}, got {[s for s, _ in stages]}")
        self.stages = list(stages)
        self.temperature, self.grad_entropy = temperature, grad_entropy
        self.cp_group = cp_group
        self.cp = 1 if cp_group is None else dist.get_world_size(cp_group)
        self.cp_rank = 0 if cp_group is None else dist.get_rank(cp_group)
        self.multiple, self.cache_size = math.lcm(pad_to_multiple_of, self.cp), cache_size
        self._schedules: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._ctx: list[PaddedMicroBatch] = []
        self._step: _Step | None = None
        self._hooks = [
            module.register_forward_pre_hook(functools.partial(self._pre_forward, stage), with_kwargs=True)
            for stage, module in self.stages
        ]

    @property
    def is_last_rank(self) -> bool:
        return self.pp_rank == self.plan.last_rank

    def close(self) -> None:
        """Remove the hooks and drop the built schedules."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._schedules.clear()

    # ------------------------------------------------------------------ training
    def run(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        loss_fn: LossFn,
        weights: Sequence[float],
        total_weight: float,
        *,
        backward: bool,
        grad_scale: float = 1.0,
    ) -> PipelineStepResult:
        """Forward (and backward) of every micro-batch; gradients accumulate into the stage modules.

        Micro-batch ``k``'s loss is backpropagated as ``loss * weights[k] / total_weight * grad_scale``
        (``grad_scale``: what the data-parallel reduction divides by, e.g. the FSDP group size).
        """
        if len(weights) != len(micro_batches) or not micro_batches:
            raise EngineError(f"{len(micro_batches)} micro-batches with {len(weights)} weights")
        if not (total_weight > 0 and math.isfinite(total_weight)):
            raise EngineError(f"total_weight must be finite and > 0, got {total_weight}")
        n = len(micro_batches)
        n_total = micro_batch_count(self.spec.name, n, self.plan.pp, self.plan.n_stages) if backward else n
        if n_total != n:
            logger.debug("pipeline schedule %s: %d micro-batches padded to %d", self.spec.name, n, n_total)
        length = padded_length(micro_batches, self.multiple)
        self._ctx = self._pad(micro_batches, n_total, length)
        all_weights = [float(w) for w in weights] + [0.0] * (n_total - n)
        self._step = _Step(loss_fn, all_weights, float(total_weight), float(grad_scale))
        try:
            if backward:
                schedule = self._schedule(n_total, length // self.cp)
                index = torch.arange(n_total)
                args = (torch.stack([p.input_ids for p in self._ctx]),) if self.stages[0][0] == 0 else ()
                schedule.step(*args, target=index, return_outputs=False, **{MB_INDEX_KWARG: index})
            else:
                outputs = forward_pass(self, self._ctx)
                with torch.no_grad():
                    for k, out in outputs.items():
                        self._loss(out, k)
            return self._broadcast_stats(n)
        finally:
            self._ctx, self._step = [], None

    def _pad(
        self, micro_batches: Sequence[dict[str, torch.Tensor]], n_total: int, length: int
    ) -> list[PaddedMicroBatch]:
        return pad_micro_batches(micro_batches, n_total, length, self.device, cp=self.cp, cp_rank=self.cp_rank)

    def _schedule(self, n_total: int, length: int) -> Any:
        from torch.distributed.pipelining import PipelineStage

        key = (n_total, length)
        if key in self._schedules:
            self._schedules.move_to_end(key)
            return self._schedules[key]
        stages = []
        for index, module in self.stages:
            inputs, outputs = self.io.example_args(index, self.plan.n_stages, length)
            stages.append(
                PipelineStage(
                    module,
                    index,
                    self.plan.n_stages,
                    self.device,
                    input_args=inputs,
                    output_args=outputs,
                    group=self.group,
                )
            )
        schedule = build_schedule(self.spec, stages, n_total, self._schedule_loss)
        self._schedules[key] = schedule
        while len(self._schedules) > self.cache_size:
            self._schedules.popitem(last=False)
        return schedule

    def _pre_forward(self, stage: int, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Micro-batch index -> the decoder's keyword arguments (torch's schedules pass the index only)."""
        if MB_INDEX_KWARG not in kwargs:
            return None
        index = int(kwargs[MB_INDEX_KWARG].reshape(-1)[0])
        rest = {k: v for k, v in kwargs.items() if k != MB_INDEX_KWARG}
        args = tuple(contiguous_grad(a) for a in args)
        aux = args[1] if self.io.n_experts and len(args) > 1 else None
        return (args[0],), {**self.stage_kwargs(stage, self._ctx[index], aux), **rest}

    def stage_kwargs(self, stage: int, p: PaddedMicroBatch, aux: Any = None) -> dict[str, Any]:
        """The keyword arguments of ``stage``'s forward for micro-batch ``p``."""
        return stage_kwargs(
            p,
            is_last=stage == self.plan.n_stages - 1,
            moe=bool(self.io.n_experts),
            role=self.io.role,
            temperature=self.temperature,
            aux=aux,
        )

    def _schedule_loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        return self._loss(output, int(target.reshape(-1)[0]))

    def _loss(self, output: Any, index: int) -> torch.Tensor:
        """Micro-batch ``index``'s scaled loss from the last stage's ``output`` (recording its stats)."""
        step = self._step
        if step is None:
            raise EngineError("the pipeline loss was called outside a step")
        out, aux = output if isinstance(output, tuple) else (output, None)
        weight, p = step.weights[index], self._ctx[index]
        if weight <= 0 or p.mb is None:
            zero = out.sum() * 0.0
            return zero + aux.sum() * 0.0 if aux is not None else zero
        outputs = per_token_outputs(
            out, aux, p, role=self.io.role, with_entropy=True, grad_entropy=self.grad_entropy, cp_group=self.cp_group
        )
        loss, stats = step.loss_fn(outputs, p.mb)
        step.recorded[index] = (loss.detach(), dict(stats))
        return loss * (weight / step.total_weight * step.grad_scale)

    def _broadcast_stats(self, n: int) -> PipelineStepResult:
        import torch.distributed as dist

        per_mb: list[dict[str, float] | None] = [None] * n
        if self.is_last_rank and self._step is not None:
            for k, (loss, stats) in self._step.recorded.items():
                if k < n:
                    per_mb[k] = {"loss": float(loss), **{key: float(v) for key, v in stats.items()}}
        if self.plan.pp > 1:
            box: list[Any] = [per_mb]
            device = self.device if torch.device(self.device).type == "cuda" else None
            dist.broadcast_object_list(box, group=self.group, group_src=self.plan.last_rank, device=device)
            per_mb = box[0]
        return PipelineStepResult(per_mb)

    # ------------------------------------------------------------------ forward only
    def forward(
        self, micro_batches: Sequence[dict[str, torch.Tensor]], *, with_entropy: bool = False
    ) -> list[dict[str, torch.Tensor]]:
        """Per-token outputs ``[T_k]`` of every micro-batch (``logprobs``/``entropy`` or ``values``), no
        gradients, on every pp rank."""
        if not micro_batches:
            raise EngineError("forward needs at least one micro-batch")
        length = padded_length(micro_batches, self.multiple)
        ctx = self._pad(micro_batches, len(micro_batches), length)
        self._ctx = ctx
        try:
            with torch.no_grad():
                last = forward_pass(self, ctx)
                results = {
                    k: per_token_outputs(
                        *(out if isinstance(out, tuple) else (out, None)),
                        ctx[k],
                        role=self.io.role,
                        with_entropy=with_entropy,
                        grad_entropy=False,
                        cp_group=self.cp_group,
                    )
                    for k, out in last.items()
                }
            keys = ["values"] if self.io.role == "critic" else ["logprobs", *(["entropy"] if with_entropy else [])]
            return broadcast_outputs(self, results, [p.n_real for p in ctx], keys)
        finally:
            self._ctx = []
