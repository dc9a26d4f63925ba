"""Worker functions of the vision-language FSDP tests, run by :mod:`launch` on every rank.

Each rank builds the engine over the whole world (data parallel), trains on its share of one
packed VLM batch and rank 0 saves what the test compares with the single-process reference.
"""

from __future__ import annotations

from pathlib import Path

import torch
from workers_fsdp import build_engine, engine_config, full_params, local_share

from tests.unit.engine.vision_helpers import token_mean_loss, token_weight, vision_batch

#: four sequences, two without images: with two ranks and two micro-batches each, some
#: micro-batches hold no image and run the vision tower on the dummy one
IMAGES = (((1, 4, 8), (1, 2, 2)), (), ((1, 8, 6),), ())


def vlm_grads_and_step(rank: int, world: int, out_dir: Path, model_dir: str, n_mbs: int) -> None:
    """Gradients of the rank's share, one clipped AdamW step, the parameters after it and the
    log-probs of the whole batch."""
    batch = vision_batch(seed=7, images=IMAGES)
    engine = build_engine(model_dir, engine_config(n_mbs, grad_clip=0.5))
    local = local_share(engine, batch)
    stats = engine.accumulate_gradients(local, token_mean_loss, token_weight)
    grads = engine.full_gradients()
    step_stats = engine.train_batch(local, token_mean_loss, token_weight)
    params = full_params(engine)
    forward = engine.forward_batch(batch)
    published = dict(engine.iter_weights())
    if rank == 0:
        torch.save(
            {
                "stats": stats,
                "grads": grads,
                "step_stats": step_stats,
                "params": params,
                "forward": forward,
                "published": published,
                "local_images": int(local["image_grid_thw"].shape[0]),
            },
            out_dir / "result.pt",
        )
    engine.destroy()
