"""The SFT loop of one train rank: demonstrations -> packed batches -> engine steps -> HF model.

The demonstrations are tokenized once (``sft_transcripts.py``; with their images for a
vision-language task). The engine is the actor's (``actor.backend`` through the engine registry) on the actor's layout
from the allocation (dp x tp x sp). Every rank builds the same global batch for a step (the data
order depends only on the seed), takes its data-parallel share (``dp_split``; ranks that differ
only in their tp/sp coordinate take the same share) and submits it with the SFT loss (``submit_train_batch``: a
step's stats are read after the next step is submitted); the engine weights micro-batches and ranks
by loss tokens, so the logged loss is the token-mean negative log-likelihood of the whole global
batch. Rank 0 shows a progress bar and appends one JSON line per
step to the metrics file. The model is saved in HF format at the end (every rank takes part).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.errors import ConfigError, EngineError
from areal_tasks.trainer.sft_data import sft_loss, sft_loss_weight
from areal_tasks.trainer.sft_transcripts import build_sft_set

if TYPE_CHECKING:
    from areal_tasks.api.train_engine import SubmittedStep
    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)


def step_indices(n_items: int, batch_size: int, step: int, seed: int, shuffle: bool) -> list[int]:
    """The item indices of ``step``: consecutive ``batch_size`` slices of per-epoch (seeded) permutations."""
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, n_items)
        order = list(range(n_items))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        indices.append(order[offset])
    return indices


def sft_engine_config(cfg: JobConfig) -> EngineConfig:
    """The actor's engine config with the SFT learning rate (``train.sft_lr``) and schedule."""
    train, actor = cfg.train, cfg.actor
    optimizer = dataclasses.replace(
        actor.optimizer, lr=train.sft_lr if train.sft_lr is not None else actor.optimizer.lr
    )
    schedule = dataclasses.replace(actor.lr_schedule, type=train.sft_lr_schedule)
    return dataclasses.replace(actor, optimizer=optimizer, lr_schedule=schedule)


def run_sft_rank(cfg: JobConfig, model_dir: str) -> Path:
    """Train this rank for ``train.sft_warmup_steps`` steps, save the HF model, return its directory."""
    import torch
    from tqdm import tqdm

    from areal_tasks.engine.microbatch import dp_split
    from areal_tasks.engine.registry import build_engine
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.trainer.engines import actor_layout

    steps = cfg.train.sft_warmup_steps
    if steps < 1:
        raise ConfigError(f"train.sft_warmup_steps={steps} must be >= 1 to run SFT")
    seed = cfg.experiment.seed
    paths = RunPaths.of(cfg.experiment.run_dir)
    demonstrations = build_sft_set(cfg, load_tokenizer(model_dir))
    engine = build_engine(
        "actor", sft_engine_config(cfg), model_dir, parallel=actor_layout(cfg), total_steps=steps, seed=seed
    )
    engine.initialize()
    info = engine.parallel
    granularity = cfg.actor.micro_batch.granularity
    is_main = info.rank == 0
    if is_main:
        paths.sft_metrics.parent.mkdir(parents=True, exist_ok=True)
        paths.sft_metrics.write_text("", encoding="utf-8")
    bar = tqdm(range(steps), desc="sft", disable=not is_main, dynamic_ncols=True)

    def record(step: int, submitted: SubmittedStep, started: float) -> None:
        stats = submitted.result()
        if not math.isfinite(stats["loss"]):
            raise EngineError(f"SFT step {step}: the loss is {stats['loss']}")
        if is_main:
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            row = {
                "step": step,
                "loss": stats["loss"],
                "grad_norm": stats["grad_norm"],
                "lr": stats["lr"],
                "n_tokens": stats["n_tokens"],
                "step_s": time.perf_counter() - started,
            }
            with paths.sft_metrics.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")

    # a step's stats are read after the next step is submitted: the host packs the next batch while
    # the device still runs this one
    previous: tuple[int, SubmittedStep, float] | None = None
    for step in bar:
        torch.manual_seed(seed * 1_000_003 + step)
        random.seed(seed * 1_000_003 + step)
        picked = step_indices(len(demonstrations), cfg.train.batch_size, step, seed, cfg.dataset.shuffle)
        batch = demonstrations.batch(picked)
        local = dp_split(batch, info.dp_size, granularity=granularity)[info.dp_rank] if info.dp_size > 1 else batch
        started = time.perf_counter()
        submitted = engine.submit_train_batch(local, sft_loss, sft_loss_weight)
        engine.step_lr_scheduler()
        if previous is not None:
            record(*previous)
        previous = (step, submitted, started)
    if previous is not None:
        record(*previous)
    bar.close()
    engine.save(str(paths.sft_model), format="hf")
    engine.destroy()
    logger.info("SFT done: %d steps, model at %s", steps, paths.sft_model)
    return paths.sft_model
