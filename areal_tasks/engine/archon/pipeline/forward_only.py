"""The pipeline's forward-only pass (no torch schedule, no backward) and the broadcast of its outputs.

Each pp rank runs its stages in increasing stage order, and all micro-batches through one stage
before the next: a stage's inputs come from the same rank (the previous stage was local) or from a
blocking receive from the previous stage's rank, and its outputs go out with asynchronous sends that
are waited for at the end. Since every rank only ever waits for a lower stage, and lower stages never
wait for higher ones, this cannot deadlock for any placement (``loop`` or ``v``) or micro-batch count.
Messages carry the sending stage's index as their tag.

Memory: the activations passed between stages of all micro-batches are alive at once (no autograd
graph is kept: the pass runs under ``no_grad``), which is what GPipe's forward would hold too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from areal_tasks.engine.archon.pipeline.padding import PaddedMicroBatch
    from areal_tasks.engine.archon.pipeline.runner import PipelineRunner

logger = logging.getLogger(__name__)


def forward_pass(runner: PipelineRunner, ctx: Sequence[PaddedMicroBatch]) -> dict[int, Any]:
    """The last stage's raw output of every micro-batch (on the last stage's rank; ``{}`` elsewhere)."""
    import torch
    import torch.distributed as dist

    plan, group, io = runner.plan, runner.group, runner.io
    last_stage = plan.n_stages - 1
    local: dict[int, list[tuple[torch.Tensor, ...]]] = {}
    results: dict[int, Any] = {}
    sends: list[Any] = []
    length = ctx[0].input_ids.shape[0]
    with torch.no_grad():
        for stage, module in runner.stages:
            prev_rank = plan.rank_of(stage - 1) if stage > 0 else None
            outs: list[tuple[torch.Tensor, ...]] = []
            for k, p in enumerate(ctx):
                if stage == 0:
                    inputs: tuple[torch.Tensor, ...] = (p.input_ids.unsqueeze(0),)
                elif prev_rank == runner.pp_rank:
                    inputs = local[stage - 1][k]
                else:
                    inputs = _receive(io, length, runner.device, prev_rank, group, tag=stage - 1)
                aux = inputs[1] if len(inputs) > 1 else None
                output = module(inputs[0], **runner.stage_kwargs(stage, p, aux))
                if stage == last_stage:
                    results[k] = output
                    continue
                flat = output if isinstance(output, tuple) else (output,)
                if plan.rank_of(stage + 1) == runner.pp_rank:
                    outs.append(flat)
                else:
                    for t in flat:
                        sends.append(
                            dist.isend(t.contiguous(), group=group, group_dst=plan.rank_of(stage + 1), tag=stage)
                        )
            local.pop(stage - 1, None)
            if outs:
                local[stage] = outs
    for work in sends:
        work.wait()
    return results


def _receive(io: Any, length: int, device: Any, src: int, group: Any, *, tag: int) -> tuple[torch.Tensor, ...]:
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(1, length, io.hidden_size, dtype=io.dtype, device=device)]
    if io.n_experts:
        tensors.append(torch.empty(2, io.n_experts, dtype=torch.float32, device=device))
    for t in tensors:
        dist.recv(t, group=group, group_src=src, tag=tag)
    return tuple(tensors)


def broadcast_outputs(
    runner: PipelineRunner,
    results: dict[int, dict[str, torch.Tensor]],
    lengths: Sequence[int],
    keys: Sequence[str],
) -> list[dict[str, torch.Tensor]]:
    """Per-micro-batch outputs (``keys``, each ``[lengths[k]]`` float32) from the last stage's rank to
    every pp rank: one flat broadcast."""
    import torch
    import torch.distributed as dist

    total = sum(lengths)
    if runner.is_last_rank:
        flat = torch.cat(
            [results[k][key].float().reshape(-1) for key in keys for k in range(len(lengths))]
        ).contiguous()
    else:
        flat = torch.empty(total * len(keys), dtype=torch.float32, device=runner.device)
    if runner.plan.pp > 1:
        dist.broadcast(flat, group=runner.group, group_src=runner.plan.last_rank)
    out: list[dict[str, torch.Tensor]] = [{} for _ in lengths]
    offset = 0
    for key in keys:
        for k, n in enumerate(lengths):
            out[k][key] = flat[offset : offset + n]
            offset += n
    return out
