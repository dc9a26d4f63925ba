"""Worker functions run by :mod:`launch` on every rank of the FSDP engine tests.

Each builds an engine over the whole world with the parallel layout it is given, runs the same
batch, and rank 0 saves what the test compares (``torch.save`` into ``out_dir``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from areal_tasks.config.engine import EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.fsdp.parallel_dims import ParallelDims
from areal_tasks.engine.microbatch import dp_split
from engine_helpers import make_batch, token_mean_loss, token_weight, value_loss

logger = logging.getLogger(__name__)


def engine_config(n_mbs: int = 1, *, lr: float = 1e-3, grad_clip: float = 0.0, **overrides) -> EngineConfig:
    return EngineConfig(
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.01, grad_clip=grad_clip),
        micro_batch=MicroBatchSpec(n_mbs=n_mbs),
        **overrides,
    )


def build_engine(model_dir: str, cfg: EngineConfig, *, sp: int = 1, tp: int = 1, **kwargs) -> FSDPEngine:
    world = torch.distributed.get_world_size()
    engine = FSDPEngine(cfg, model_dir, parallel=ParallelDims.for_world(world, sp=sp, tp=tp), **kwargs)
    engine.initialize()
    return engine


def local_share(engine: FSDPEngine, batch: dict) -> dict:
    info = engine.parallel
    return dp_split(batch, info.dp_size)[info.dp_rank] if info.dp_size > 1 else batch


def full_params(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in engine.model.named_parameters()
    }


def grads_and_step(
    rank: int, world: int, out_dir: Path, model_dir: str, n_mbs_list: list[int], sp: int = 1, tp: int = 1,
    grad_clip: float = 0.5, critic: bool = False,
) -> None:
    """For each micro-batch count: gradients of one batch, then one clipped AdamW step."""
    batch = make_batch(seed=0)
    loss_fn = value_loss if critic else token_mean_loss
    for n_mbs in n_mbs_list:
        cfg = engine_config(n_mbs, grad_clip=grad_clip, value_head=critic)
        engine = build_engine(model_dir, cfg, sp=sp, tp=tp)
        local = local_share(engine, batch)
        stats = engine.accumulate_gradients(local, loss_fn, token_weight)
        grads = engine.full_gradients()
        step_stats = engine.train_batch(local, loss_fn, token_weight)
        params = full_params(engine)
        logprobs = None if critic else engine.forward_batch(batch, with_entropy=True)
        if rank == 0:
            torch.save(
                {"stats": stats, "grads": grads, "step_stats": step_stats, "params": params, "forward": logprobs},
                out_dir / f"result_mbs{n_mbs}.pt",
            )
        engine.destroy()
