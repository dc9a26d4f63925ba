"""Worker functions of the checkpoint tests (run on 2 gloo ranks by ``launch.run_workers``).

``train_run`` is a small deterministic training loop over the FSDP engine that checkpoints through
the CheckpointManager: each step's batch comes from (seed, step) plus draws from the global torch,
NumPy and Python RNGs (seeded differently per rank), like an RL loop whose sampling uses them. It
resumes with ``recover.mode=auto`` and can SIGKILL itself in the middle of a save. ``lora_run``
exercises incremental and async saves on a LoRA engine and the HF export.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from engine_helpers import make_batch, token_mean_loss, token_weight
from workers_fsdp import build_engine, engine_config, full_params, local_share

from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.config.engine import LoRAConfig, LRScheduleConfig
from areal_tasks.config.sections import SaverConfig

logger = logging.getLogger(__name__)

SEED = 17


def _batch(step: int) -> dict:
    """The step's batch: fixed by (SEED, step), then perturbed by the global RNGs (differ per rank)."""
    batch = make_batch(seed=SEED * 1000 + step)
    noise = torch.randn(batch["advantages"].shape) * 0.1 + float(np.random.rand()) * 0.01 + random.random() * 0.01
    batch["advantages"] = batch["advantages"] + noise
    return batch


def full_optimizer_state(engine: Any) -> dict:
    """The full (gathered) optimizer state on rank 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(engine.model, engine.optimizer, options=options)


def _kill_during_next_save() -> None:
    """SIGKILL this process right after it wrote its DCP data file, before the save can commit."""
    from areal_tasks.checkpoint.dcp_io import StorageDCPWriter

    original = StorageDCPWriter.write_data

    def write_then_die(self, plan, planner):  # type: ignore[no-untyped-def]
        result = original(self, plan, planner)
        logger.warning("test: SIGKILL after writing %s", plan.storage_data)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    StorageDCPWriter.write_data = write_then_die  # type: ignore[method-assign]


def train_run(
    rank: int,
    world: int,
    out_dir: Path,
    model_dir: str,
    url: str,
    steps: int,
    save_every: int,
    tag: str,
    kill_at: int | None = None,
    stop_at: int | None = None,
    options: dict | None = None,
) -> None:
    """Train up to ``steps`` (resuming from the latest checkpoint at ``url``; ``stop_at``: leave after
    that step, like a preempted job); rank 0 saves results."""
    cfg = engine_config(2, grad_clip=1.0, lr_schedule=LRScheduleConfig(type="cosine", warmup_steps=1))
    engine = build_engine(model_dir, cfg, total_steps=steps)
    torch.manual_seed(SEED + rank)
    np.random.seed(SEED + rank)
    random.seed(SEED + rank)
    manager = CheckpointManager(url, options, "exp", "trial", SaverConfig(freq_steps=save_every, keep_last=2))
    engines = {"actor": engine}
    state = manager.recover("auto", engines)
    first = 1 if state is None else state.step + 1
    metrics: dict[int, dict[str, float]] = {}
    for step in range(first, (stop_at or steps) + 1):
        stats = engine.train_batch(local_share(engine, _batch(step)), token_mean_loss, token_weight)
        engine.step_lr_scheduler()
        engine.set_version(step)
        metrics[step] = {k: float(v) for k, v in stats.items()}
        if manager.should_save(step, last=step == steps):
            if kill_at == step:
                _kill_during_next_save()
            trainer = TrainerState(
                step=step, version=step, dataloader={"next": (SEED, step + 1)}, executor={"metrics": metrics[step]}
            )
            manager.save(step, engines, trainer, {"loss": stats["loss"]}).wait()
    manager.close()
    params, optim = full_params(engine), full_optimizer_state(engine)
    if rank == 0:
        torch.save(
            {
                "params": params,
                "optim": optim,
                "metrics": metrics,
                "resumed_from": None if state is None else state.step,
                "trainer_state": None if state is None else state.to_dict(),
                "version": engine.get_version(),
                "last_lr": engine.lr_scheduler.get_last_lr(),
                "listing": [(i.step, i.status) for i in manager.list()],
            },
            out_dir / f"{tag}.pt",
        )
    engine.destroy()


def sequence(rank: int, world: int, out_dir: Path, calls: list[tuple[str, dict]]) -> None:
    """Run several worker functions of this module one after the other in one launch (saves a
    process start-up, the slowest part of these tests on 2 cores)."""
    for name, kwargs in calls:
        globals()[name](rank, world, out_dir, **kwargs)


LORA = {"enabled": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def lora_run(rank: int, world: int, out_dir: Path, model_dir: str, url: str, options: dict | None = None) -> None:
    """Async incremental saves of a LoRA engine: training goes on while a save is in flight; retention
    keeps the last and the best ("score": step 1); a fresh engine loads the latest; HF export."""
    from areal_tasks.checkpoint.export import export_hf, read_engine_tensors

    cfg = engine_config(2, lora=LoRAConfig(**LORA))
    engine = build_engine(model_dir, cfg, total_steps=3)
    saver = SaverConfig(keep_last=1, keep_best_metric="score", async_save=True)
    manager = CheckpointManager(url, options, "exp", "lora", saver)
    engines = {"actor": engine}
    at_save, tickets = {}, []
    scores = {1: 1.0, 2: 0.0, 3: 0.5}
    for step in (1, 2, 3):
        # the step after a save trains while that save may still be writing
        engine.train_batch(local_share(engine, make_batch(seed=step)), token_mean_loss, token_weight)
        at_save[step] = full_params(engine)
        tickets.append(manager.save(step, engines, TrainerState(step=step), {"score": scores[step]}))
    metas = [t.wait().to_dict() for t in tickets]
    engine.save(str(out_dir / "engine_hf"), "hf")
    fresh = build_engine(model_dir, cfg, total_steps=3)
    state = manager.load(None, {"actor": fresh})
    loaded = full_params(fresh)
    manager.close()
    if rank == 0:
        storage = manager.layout.storage
        reread = {step: read_engine_tensors(storage, step, "actor") for step in (1, 3)}
        export_hf(storage, 3, out_dir / "export_hf")
        listing = [(i.step, i.status) for i in manager.list()]
        torch.save(
            {
                "metas": metas,
                "at_save": at_save,
                "loaded": loaded,
                "loaded_step": state.step,
                "reread": reread,
                "listing": listing,
                "files": storage.walk_files(),
            },
            out_dir / "lora.pt",
        )
    dist.barrier()
    fresh.destroy()
    engine.destroy()
