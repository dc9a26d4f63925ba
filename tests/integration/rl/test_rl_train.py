"""``areal train`` end to end on a tiny model (2 gloo train ranks, one embedded server): the loop's
mechanics, not learning quality (tests/integration/rl/test_learning.py checks that).

One short SFT model is shared by the module. Each run checks what a user sees: the summary and its
keys, one metrics row per step with versions advancing, a checkpoint per ``saver.freq_steps``, and
recovery that continues after the last checkpoint instead of starting over. Also: PPO with a critic,
the multi-turn workflow, asynchronous rollout (eta = 2) and a broken reward that fails the run with
the reward's own error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import WorkerFailedError
from areal_tasks.trainer.rl import run_train
from areal_tasks.trainer.sft import run_sft

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

DATASET = "demo:arithmetic?n_train=64&n_eval=8"
BASE = [
    "allocation=embedded:d1+fsdp:d2",
    f"dataset.path={DATASET}",
    "train.batch_size=8",
    "rollout.group_size=4",
    "rollout.max_concurrent_rollouts=8",
    "rollout.sampling.max_new_tokens=6",
    "rollout.reward.workers=1",
    "actor.optimizer.lr=1e-4",
    "actor.lr_schedule.type=constant",
    "train.sft_warmup_steps=0",
]


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    run_dir = tmp_path_factory.mktemp("sft")
    cfg = load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={run_dir}", *BASE,
                                                 "train.sft_warmup_steps=6", "train.total_steps=7",
                                                 "actor.optimizer.lr=3e-3"])  # fmt: skip
    return str(run_sft(cfg))


def train(run_dir: Path, model: str, *overrides: str) -> dict:
    cfg = load_config("configs/demo_grpo.yaml", [f"experiment.run_dir={run_dir}", f"model.path={model}", *BASE, *overrides])
    return run_train(cfg)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]


def test_grpo_run_writes_summary_metrics_and_checkpoints_then_recovers(tmp_path: Path, sft_model: str) -> None:
    summary = train(tmp_path, sft_model, "train.total_steps=3", "saver.freq_steps=2")
    assert summary["steps"] == 3 and summary["first_step"] == 1 and summary["final_version"] == 3
    for key in ("reward_before", "reward_after", "wall_seconds"):
        assert math.isfinite(summary[key])
    assert 0.0 <= summary["reward_before"] <= 1.0 and 0.0 <= summary["reward_after"] <= 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["version"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["staleness/max"] == 0.0 for r in rows)  # eta = 0: synchronous
    assert all(r["actor/grad_norm"] is not None and r["perf/weight_update_s"] > 0 for r in rows)
    checkpoints = sorted(p.name for p in (tmp_path / "storage").rglob("step_*") if p.is_dir())
    assert checkpoints == ["step_2", "step_3"]
    # asking for 5 steps now continues after the checkpoint of step 3
    resumed = train(tmp_path, sft_model, "train.total_steps=5", "saver.freq_steps=2")
    assert resumed["first_step"] == 4 and resumed["final_version"] == 5
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_ppo_with_a_critic_trains_both(tmp_path: Path, sft_model: str) -> None:
    train(tmp_path, sft_model, "train.total_steps=2", "algorithm.name=ppo", "critic.value_head=true",
          "critic.optimizer.lr=1e-4")  # fmt: skip
    rows = metrics(tmp_path)
    assert len(rows) == 2
    assert all(math.isfinite(r["critic/value_loss"]) and math.isfinite(r["actor/loss"]) for r in rows)


def test_multi_turn_and_async_rollout(tmp_path: Path, sft_model: str) -> None:
    summary = train(tmp_path, sft_model, "train.total_steps=4", "rollout.workflow.name=multi_turn",
                    "rollout.max_head_offpolicyness=2", "rollout.max_concurrent_rollouts=16")  # fmt: skip
    assert summary["max_head_offpolicyness"] == 2
    rows = metrics(tmp_path)
    assert len(rows) == 4
    assert max(r["staleness/max"] for r in rows) <= 2.0
    assert summary["executor"]["consumed_samples"] == 4 * 8


def test_a_reward_that_cannot_be_imported_fails_the_run_with_its_name(tmp_path: Path, sft_model: str) -> None:
    with pytest.raises(WorkerFailedError, match="no_such_module"):
        train(tmp_path, sft_model, "train.total_steps=2", "rollout.reward.fn=no_such_module:score")
