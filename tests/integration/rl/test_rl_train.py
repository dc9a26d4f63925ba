"""``areal train`` end to end on a tiny model (2 gloo train ranks, one embedded server): the loop's
mechanics, not learning quality (tests/integration/rl/test_learning.py checks that).

The session's warm start (conftest.py) is the starting policy. Each run checks what a user sees: the summary and its
keys, one metrics row per step with versions advancing, a checkpoint per ``saver.freq_steps``, and
recovery that continues after the last checkpoint instead of starting over, with weight updates
through shared memory (the servers map the trainer's buffer). Also: the multi-turn
workflow with asynchronous rollout (eta = 2), the rollout side in its own process (what ``auto``
picks on GPUs), in-place pauses and collective (broadcast) weight updates, tracked in MLflow through a
URI holding a secret (the workers read a redacted ``rl_config.yaml`` and get the secret from their
environment; no file of the run holds it), and a broken reward that fails the run in a second,
before anything starts. (PPO with a critic:
test_learning.py.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import RewardError
from areal_tasks.trainer.rl import run_train

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
    "actor.micro_batch.granularity=4",
    "train.sft_warmup_steps=0",
]


def train(run_dir: Path, model: str, *overrides: str) -> dict:
    cfg = load_config(
        "configs/demo_grpo.yaml", [f"experiment.run_dir={run_dir}", f"model.path={model}", *BASE, *overrides]
    )
    return run_train(cfg)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]


def test_grpo_run_writes_summary_metrics_and_checkpoints_then_recovers(tmp_path: Path, warm_start: str) -> None:
    buffers_before = set(Path("/dev/shm").glob("areal-weights-*"))
    summary = train(tmp_path, warm_start, "train.total_steps=3", "saver.freq_steps=2", "rollout.weight_update=shared")
    assert set(Path("/dev/shm").glob("areal-weights-*")) == buffers_before  # the trainer removed its buffer
    assert summary["steps"] == 3 and summary["first_step"] == 1 and summary["final_version"] == 3
    for key in ("reward_before", "reward_after", "wall_seconds"):
        assert math.isfinite(summary[key])
    assert 0.0 <= summary["reward_before"] <= 1.0 and 0.0 <= summary["reward_after"] <= 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["version"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["staleness/max"] == 0.0 for r in rows)  # eta = 0: synchronous
    assert all(r["actor/grad_norm"] is not None and r["perf/weight_update_s"] > 0 for r in rows)
    # the server generated with the trainer's weights of each version, so the trainer recomputes its
    # log-probs (behaviour weights 1); a server left on the old weights gives maxima of 1.4 here
    assert all(abs(r["actor/behav_weight_max"] - 1.0) < 1e-3 for r in rows)
    checkpoints = sorted(p.name for p in (tmp_path / "storage").rglob("step_*") if p.is_dir())
    assert checkpoints == ["step_2", "step_3"]
    # asking for 5 steps now continues after the checkpoint of step 3
    resumed = train(tmp_path, warm_start, "train.total_steps=5", "saver.freq_steps=2")
    assert resumed["first_step"] == 4 and resumed["final_version"] == 5
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_multi_turn_async_rollout_tracked_in_mlflow(tmp_path: Path, warm_start: str) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    secret = "TRACKINGTOKEN4242"  # sqlite ignores the query; a redacted URI is refused by the callback
    summary = train(
        tmp_path,
        warm_start,
        "train.total_steps=4",
        "rollout.workflow.name=multi_turn",
        "rollout.max_head_offpolicyness=2",
        "rollout.max_concurrent_rollouts=16",
        "rollout.own_process=on",  # the rollout side in a child process, as on GPUs
        "rollout.pause_mode=in_place",  # in-flight requests stay on the server across updates
        "rollout.weight_update=collective",  # broadcast from train rank 0 over gloo, as NCCL on GPUs
        f"tracking.mlflow_uri={uri}?token={secret}",
        f"tracking.mlflow_artifact_location={tmp_path / 'artifacts'}",
        "saver.freq_steps=2",
    )
    assert summary["max_head_offpolicyness"] == 2
    rows = metrics(tmp_path)
    assert len(rows) == 4
    assert max(r["staleness/max"] for r in rows) <= 2.0
    assert [r["version"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert all(r["perf/weight_transfer_s"] > 0 for r in rows)
    assert summary["executor"]["consumed_samples"] == 4 * 8
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("demo_grpo").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.workflow.name"] == "multi_turn"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2, 3, 4]
    assert run.data.tags["areal.latest_checkpoint"].endswith("step_4")
    assert (tmp_path / "artifacts" / run.info.run_id / "artifacts" / "summary" / "rl_summary.json").is_file()
    assert run.data.params["tracking.mlflow_uri"] == f"{uri}?token=***"
    assert "token=***" in (tmp_path / "rl_config.yaml").read_text()
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks


def test_a_reward_that_cannot_be_imported_fails_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(RewardError, match="no_such_module"):
        train(tmp_path, "tiny:qwen2", "train.total_steps=2", "rollout.reward.fn=no_such_module:score")
    assert not (tmp_path / "logs").exists()  # no process was started
