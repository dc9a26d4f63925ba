"""A very short SFT warm start (2 gloo workers) and its evaluation through the embedded server.

Checks the whole pipeline, not the learning quality: the SFT loss goes down over a few steps at a
large learning rate, the saved directory is a loadable HF model, and evaluation returns a finite
accuracy in [0, 1] with completions for every prompt.
"""

from __future__ import annotations

import json
import math

import pytest

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.config import load_config
from areal_tasks.launch import LocalScheduler
from areal_tasks.trainer.evaluate import evaluate
from areal_tasks.trainer.sft import run_sft

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]


def test_short_sft_then_evaluate(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    cfg = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={tmp_path}",
            "allocation=embedded:d1+fsdp:d2",
            "dataset.path=demo:arithmetic?n_train=32&n_eval=4",
            "train.sft_warmup_steps=6",
            "train.total_steps=10",
            "train.batch_size=8",
            "rollout.group_size=4",
            "rollout.max_concurrent_rollouts=8",
            "actor.micro_batch.granularity=4",
            "actor.optimizer.lr=3e-3",
            "rollout.sampling.max_new_tokens=6",
        ],
    )
    with LocalScheduler(tmp_path) as scheduler:
        model_dir = run_sft(cfg, scheduler)
        result = evaluate(cfg, str(model_dir), 4, scheduler=scheduler)

    losses = [json.loads(line)["loss"] for line in RunPaths.of(tmp_path).sft_metrics.read_text().splitlines()]
    assert len(losses) == 6
    assert losses[-1] < losses[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert result["n_prompts"] == 4 and len(result["samples"]) == 4
    assert math.isfinite(result["accuracy"]) and 0.0 <= result["accuracy"] <= 1.0
