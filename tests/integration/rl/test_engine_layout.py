"""The allocation is the layout, end to end: a short ``areal train`` (2 gloo train ranks, one embedded
server, one RL step on the tiny model) with ``fsdp:d1t2`` trains with tensor parallelism 2 and with
``fsdp:d1c2`` with Ulysses sequence parallelism 2, as the engines themselves report it
(``engine_layout`` in ``summary.json``, read from each engine's ``parallel``). The ``t2`` job also
runs one SFT warm-start step, which now trains on the actor's whole layout too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.rl import run_train

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

OVERRIDES = [
    "dataset.path=demo:arithmetic?n_train=16&n_eval=4",
    "model.path=tiny:qwen2",
    "train.batch_size=4",
    "rollout.group_size=4",
    "rollout.max_concurrent_rollouts=4",
    "rollout.sampling.max_new_tokens=4",
    "rollout.reward.workers=1",
    "actor.micro_batch.granularity=4",
    "evaluation.n_samples=1",
]


@pytest.mark.parametrize(
    ("trainer", "sft_steps", "expected"),
    [("fsdp:d1t2", 1, {"dp": 1, "tp": 2, "sp": 1}), ("fsdp:d1c2", 0, {"dp": 1, "tp": 1, "sp": 2})],
)
def test_the_job_trains_with_the_allocations_dims(tmp_path: Path, trainer: str, sft_steps: int, expected: dict) -> None:
    steps = [f"train.sft_warmup_steps={sft_steps}", f"train.total_steps={sft_steps + 1}"]
    cfg = load_config(
        "configs/demo_grpo.yaml",
        [f"experiment.run_dir={tmp_path}", f"allocation=embedded:d1+{trainer}", *OVERRIDES, *steps],
    )
    summary = run_train(cfg)
    assert summary.get("sft_steps", 0) == sft_steps
    assert summary["engine_layout"] == {"actor": {"world_size": 2, **expected}}
    assert json.loads((tmp_path / "summary.json").read_text())["engine_layout"] == summary["engine_layout"]
    (row,) = [json.loads(line) for line in (tmp_path / "rl_metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and math.isfinite(row["actor/loss"]) and math.isfinite(row["actor/grad_norm"])
