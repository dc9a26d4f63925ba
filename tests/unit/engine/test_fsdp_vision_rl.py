"""A VLM through the trainer's seams: the trainer's ``build_engines`` builds the fsdp engine of a tiny
Qwen2-VL, trajectories whose images come from the kit's ``VisionProcessor`` are packed with
``pack_trajectories`` and one GRPO step runs through ``RLStep`` (proximal log-probs, group
advantages, the PPO loss over mini-batches); the step's proximal log-probs are the behaviour
log-probs of transformers' own forward, and a DCP checkpoint restores the trained weights exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from areal_tasks.algo import build_algorithm
from areal_tasks.api.workflow import Trajectory
from areal_tasks.config import load_config
from areal_tasks.models.vision_processor import VisionProcessor
from areal_tasks.trainer.engines import build_engines
from areal_tasks.trainer.rl_batch import pack_trajectories
from areal_tasks.trainer.rl_step import RLStep
from tests.unit.engine.vision_helpers import load_reference, reference_logprobs

GROUP = 2


def _trajectories(model_dir) -> list[Trajectory]:
    """Two groups: prompts with one image, two images, no image and one image; random answers."""
    from PIL import Image

    processor = VisionProcessor.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    trajs = []
    for i, sizes in enumerate([[(40, 56)], [(64, 64), (20, 90)], [], [(48, 32)]]):
        images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
        parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"what is shape {i}?"}]
        encoded = processor.encode_chat([{"role": "user", "content": parts}], images)
        answer = rng.integers(0, 1000, 3 + i).tolist()
        prompt = encoded.input_ids
        trajs.append(
            Trajectory(
                input_ids=prompt + answer,
                loss_mask=[0] * len(prompt) + [1] * len(answer),
                logprobs=[0.0] * (len(prompt) + len(answer)),
                versions=[-1] * len(prompt) + [0] * len(answer),
                reward=float(i % 2),
                prompt_len=len(prompt),
                multimodal={"pixel_values": encoded.pixel_values, "image_grid_thw": encoded.image_grid_thw}
                if images
                else None,
            )
        )
    return trajs


def test_grpo_step_and_checkpoint_of_a_vlm(tiny_qwen2_vl, world_of_one, tmp_path):
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.checkpoint.state import TrainerState
    from areal_tasks.config.sections import SaverConfig

    cfg = load_config(
        None,
        [
            f"experiment.run_dir={tmp_path}",
            "algorithm.name=grpo",
            f"rollout.group_size={GROUP}",
            f"train.batch_size={2 * GROUP}",
            "actor.optimizer.lr=1e-3",
        ],
    )
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, ppo_n_minibatches=2))
    engines = build_engines(cfg, str(tiny_qwen2_vl), n_steps=2)
    actor = engines["actor"]
    assert actor.vision is not None

    trajs = _trajectories(tiny_qwen2_vl)
    batch = pack_trajectories(trajs, GROUP, 0)
    assert batch["seq_n_images"].tolist() == [1, 2, 0, 1]
    with torch.no_grad():
        behaviour = reference_logprobs(load_reference(tiny_qwen2_vl), batch)
    # the behaviour log-probs a server of the same weights would report: the step is on-policy
    batch["logprobs"] = behaviour * batch["loss_mask"]

    algorithm = build_algorithm(cfg.algorithm)
    assert algorithm.needs_prox_logprobs
    stats = RLStep(actor, algorithm, GROUP).run(batch)
    assert stats["actor/grad_norm"] > 0 and np.isfinite(stats["actor/loss"])
    # proximal (the engine's packed forward) / behaviour (transformers per sequence): 1 everywhere
    assert stats["actor/behav_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["actor/behav_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    trained = dict(actor.iter_weights())

    manager = CheckpointManager(f"file://{tmp_path}/checkpoints", None, "exp", "trial", SaverConfig())
    manager.save(1, engines, TrainerState(step=1, version=1), {}).wait()
    fresh = build_engines(cfg, str(tiny_qwen2_vl), n_steps=2)
    assert manager.recover("auto", fresh).step == 1
    restored = dict(fresh["actor"].iter_weights())
    assert restored.keys() == trained.keys()
    assert all(torch.equal(restored[name], tensor) for name, tensor in trained.items())
    manager.close()
