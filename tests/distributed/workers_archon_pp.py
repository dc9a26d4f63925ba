"""Worker functions run by :mod:`launch` on every rank of the archon pipeline tests.

Every rank builds the same toy decoder (``tests/fixtures/archon_pp_toy.py``, fixed seed), keeps its
pipeline stages, and runs the same packed batch split into each micro-batch count of ``n_mbs_list``:
a training step (gradients), an eval step (losses without backward) and a forward-only pass. Each
rank saves its own stages' gradients by global parameter name, and the stats and forward outputs it
returned, to ``out_dir/rank{r}.pt``; the test compares them with a single-process run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from engine_helpers import make_batch, token_weight

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.archon.pipeline.runner import PipelineRunner
from areal_tasks.engine.archon.pipeline.schedule import StageIO, schedule_spec
from areal_tasks.engine.archon.pipeline.split import split_layers
from areal_tasks.engine.archon.pipeline.stages import build_stage_modules, make_plan
from areal_tasks.engine.microbatch import split_into_micro_batches
from tests.fixtures.archon_pp_toy import make_toy

logger = logging.getLogger(__name__)

HIDDEN, VOCAB = 16, 64


def toy_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    """A token-mean policy-gradient-like loss, plus the router statistics' term for MoE models and the
    value regression for a critic: every output of the last stage carries gradient."""
    mask = mb["loss_mask"].float()
    denom = mask.sum().clamp(min=1.0)
    if "values" in outputs:
        loss = (((outputs["values"] - mb["advantages"]) ** 2) * mask).sum() / denom
        stats = {"mean_value": (outputs["values"].detach() * mask).sum() / denom}
    else:
        loss = -(outputs["logprobs"] * mb["advantages"] * mask).sum() / denom
        stats = {"entropy": (outputs["entropy"].detach() * mask).sum() / denom, "n_masked": float(mask.sum())}
    if "moe_aux" in outputs:
        aux = outputs["moe_aux"]
        loss = loss + 0.1 * (aux[0] * aux[1]).sum() / aux[0].sum().clamp(min=1.0)
    return loss, stats


def micro_batches(n_mbs: int) -> list[dict]:
    batch = make_batch(seed=0, n_seqs=8, vocab=VOCAB, min_len=3, max_len=13)
    return split_into_micro_batches(batch, MicroBatchSpec(n_mbs=n_mbs)).micro_batches


def pipeline_step(
    rank: int,
    world_size: int,
    out_dir: Path,
    schedule: str,
    stages_per_rank: int = 1,
    n_layers: int = 4,
    n_experts: int = 0,
    role: str = "actor",
    n_mbs_list: tuple[int, ...] = (1, 2, 3, 4),
    grad_scale: float = 1.0,
) -> None:
    spec = schedule_spec(schedule, stages_per_rank)
    model = make_toy(0, vocab=VOCAB, hidden=HIDDEN, n_layers=n_layers, n_experts=n_experts, role=role)
    plan = make_plan(split_layers([1.0] * n_layers, world_size * stages_per_rank), world_size, spec.placement)
    stages = build_stage_modules(model, plan, rank)
    io = StageIO(hidden_size=HIDDEN, dtype=torch.float32, n_experts=n_experts, role=role)
    runner = PipelineRunner(stages, plan, schedule=schedule, io=io, device=torch.device("cpu"))
    params = {n: p for _, m in stages for n, p in m.named_parameters()}
    results = {}
    for n_mbs in n_mbs_list:
        mbs = micro_batches(n_mbs)
        weights = [token_weight(mb) for mb in mbs]
        for p in params.values():
            p.grad = None
        start = time.monotonic()
        train = runner.run(mbs, toy_loss, weights, sum(weights), backward=True, grad_scale=grad_scale)
        train_s = time.monotonic() - start
        grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
        evaluated = runner.run(mbs, toy_loss, weights, sum(weights), backward=False)
        assert all(p.grad is None or torch.equal(p.grad, grads[n]) for n, p in params.items()), "eval changed grads"
        forward = runner.forward(mbs, with_entropy=True)
        results[n_mbs] = {
            "train": train.per_mb,
            "train_sums": train.weighted_sums(weights),
            "eval": evaluated.per_mb,
            "weights": weights,
            "grads": grads,
            "forward": forward,
            "train_s": train_s,
        }
    runner.close()
    torch.save({"stages": [s for s, _ in stages], "results": results}, out_dir / f"rank{rank}.pt")
    dist.barrier()
