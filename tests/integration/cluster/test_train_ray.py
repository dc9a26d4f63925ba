"""``areal train`` from the host (the login node) on the 2-node namespace Ray cluster learns.

The host is no Ray node, so ``areal train ... cluster.scheduler=ray cluster.nodes=2`` submits itself
as a Ray job through the dashboard (launch/submit.py) and follows it (launch/follow.py): the job's
controller runs on the head (node 0), the demo's ``embedded:d1+fsdp:d2`` puts train rank 0 on node 0
and rank 1 on node 1 (gloo across the nodes), and the run directory under the test's tmp dir is
shared by the host and the nodes. RL from the session's warm start with test_learning's settings
(30 steps, lr 2e-4, 8 eval samples per prompt) raises the eval reward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.trainer.rl import RL_GROUP
from tests.fixtures.ray_cluster import RayCluster

pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

RL_STEPS = 30
MIN_GAIN = 0.05


def host_env() -> dict[str, str]:
    """The host's environment for ``areal train``: no Ray address (it must submit), no proxies."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    return env


def test_areal_train_from_the_host_on_two_ray_nodes_learns(
    ray_cluster: RayCluster, warm_start: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "train",
        "--config",
        "configs/demo_grpo.yaml",
        "cluster.scheduler=ray",
        "cluster.nodes=2",
        f"cluster.ray.dashboard_url={ray_cluster.dashboard_url}",
        f"experiment.run_dir={run_dir}",
        "experiment.trial=train-ray",
        f"model.path={warm_start}",
        "train.sft_warmup_steps=0",
        f"train.total_steps={RL_STEPS}",
        "actor.optimizer.lr=2e-4",
        "saver.freq_steps=null",
        "evaluation.n_samples=8",
        "rollout.max_head_offpolicyness=0",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=ray_cluster.repo_root, env=host_env(), capture_output=True, text=True, timeout=840, check=False
    )
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"areal train exited {done.returncode} after {wall:.0f} s:\n{output[-8000:]}"
    assert "submitted job demo_grpo-train-ray to ray" in done.stderr, done.stderr[-3000:]
    assert "job demo_grpo-train-ray succeeded" in done.stdout, done.stdout[-3000:]

    summary = json.loads(RunPaths.of(run_dir).summary.read_text())
    node0, node1 = (n.name for n in ray_cluster.netns.nodes)
    placement = summary["placement"]
    print(
        f"\n[test_train_ray] eval reward {summary['reward_before']:.3f} -> {summary['reward_after']:.3f} "
        f"in {wall:.0f} s (placement {placement})"
    )
    assert placement["actor"] == [node0, node1], placement  # rank 0 on node 0, rank 1 on node 1
    for rank in (0, 1):
        assert RunPaths.of(run_dir).worker_log(RL_GROUP, rank).is_file(), f"no log of train rank {rank}"
    assert summary["reward_after"] >= summary["reward_before"] + MIN_GAIN, summary
    # the followed job's log reached the host's terminal
    assert "step" in done.stdout.lower(), done.stdout[-3000:]
