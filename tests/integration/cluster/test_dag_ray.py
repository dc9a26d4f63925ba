"""The ``areal_rl_training`` DAG against the 2-node namespace Ray cluster, with a worker node killed.

``dag.test()`` (tests/fixtures/dag_runner.py) runs the DAG with ``scheduler=ray``, ``nodes=2``, the
``areal_ray`` connection from ``$AIRFLOW_CONN_AREAL_RAY`` (the dashboard through the bridge), a
few RL steps from the session's warm start, a checkpoint every step and one retry of the train task.
Once the first checkpoint is in the run's storage, node 1 is killed (its init, and with it the Ray
worker, the supervisor actor and train rank 1), then brought back with a new Ray worker. The
controller sees the lost node, the Ray job fails, the train task's try 1 fails; try 2 finds the
failed job by name, resubmits it with ``recover.mode=auto`` (Ray submission ``<name>--2``) and the
run resumes after the checkpointed step. Every task ends successful and MLflow holds the model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.launch.ray.jobs import RayJobs
from tests.fixtures.dag_runner import dag_env, finish_dag_test, start_dag_test
from tests.fixtures.ray_cluster import RayCluster

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.ray,
    pytest.mark.airflow,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(900),
]

MODEL_NAME = "areal-ray-policy"
RL_STEPS = 10
DAG_TIMEOUT_S = 720.0


def _checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints (``_COMPLETE`` written) in the run's storage."""
    return sorted(marker.parent for marker in run_dir.glob("storage/**/step_*/_COMPLETE"))


def _ray_jobs_of(dashboard_url: str, run_dir: Path) -> list[dict[str, Any]]:
    """The Ray submissions of this run (metadata run_dir), oldest attempt first."""
    answer = RayJobs(dashboard_url).dashboard.get("/api/jobs/")
    mine = [j for j in answer if (j.get("metadata") or {}).get("run_dir") == str(run_dir)]
    return sorted(mine, key=lambda j: int(j["metadata"]["attempt"]))


@pytest.mark.kills_nodes
def test_dag_on_ray_survives_a_killed_worker_node(ray_cluster: RayCluster, warm_start: str, tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    pytest.importorskip("mlflow", reason="MLflow is not installed: pip install -e '.[tracking]'")
    base, run_dir = tmp_path, tmp_path / "run"
    tracking_uri = f"sqlite:///{base / 'mlflow.db'}"
    connection = {"conn_type": "http", "host": ray_cluster.dashboard_url, "extra": {"request_timeout_s": 20}}
    env = dag_env(
        base,
        tracking_uri,
        {
            "AIRFLOW_CONN_AREAL_RAY": json.dumps(connection),
            "AREAL_DAG_RETRIES": "1",
            "AREAL_DAG_RETRY_DELAY_S": "2",
            "RAY_USAGE_STATS_ENABLED": "0",
        },
    )
    for key in [k for k in env if k.startswith("RAY_") and k != "RAY_USAGE_STATS_ENABLED"]:
        env.pop(key)  # the DAG submits through the connection, from outside the cluster
    conf = {
        "config": "configs/demo_grpo.yaml",
        "run_dir": str(run_dir),
        "model": warm_start,
        "sft_steps": 0,
        "max_steps": RL_STEPS,
        "eval_prompts": 8,
        "registered_model_name": MODEL_NAME,
        "scheduler": "ray",
        "nodes": 2,
        "extra_overrides": ["saver.freq_steps=1", "train.batch_size=32"],
    }
    started = time.perf_counter()
    child = start_dag_test(base, conf, env)
    killed_at = restarted_at = None
    killed_wall = 0.0
    try:
        deadline = time.monotonic() + DAG_TIMEOUT_S
        while not _checkpoints(run_dir):
            assert child.poll() is None, (base / "dag_test.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.2)
        first_checkpoint = _checkpoints(run_dir)[0].name
        ray_cluster.netns.nodes[1].kill()  # node 1's init: every process of the node, Ray's worker included
        killed_at, killed_wall = time.perf_counter(), time.time()
        ray_cluster.restart_worker()
        restarted_at = time.perf_counter()
        report = finish_dag_test(base, child, DAG_TIMEOUT_S, started)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if len(ray_cluster.alive_nodes()) < 2:
            ray_cluster.restart_worker()
    log = report["log"]
    failed = {k: v for k, v in report["tasks"].items() if v not in ("success", "skipped")}
    assert not failed and report["state"].endswith("success"), f"{report['tasks']}\n{log[-6000:]}"
    assert report["tasks"]["register_model"] == "success"

    jobs = _ray_jobs_of(ray_cluster.dashboard_url, run_dir)
    assert [(j["metadata"]["attempt"], j["status"]) for j in jobs] == [("1", "FAILED"), ("2", "SUCCEEDED")], jobs
    assert "resubmitting with recover.mode=auto" in log, log[-6000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["first_step"] > 1, summary  # try 2 resumed after a checkpoint, not from step 1

    from mlflow import MlflowClient

    versions = MlflowClient(tracking_uri=tracking_uri).search_model_versions(f"name='{MODEL_NAME}'")
    assert versions, f"no version of {MODEL_NAME} registered"
    assert killed_at is not None and restarted_at is not None
    print(
        f"\n[test_dag_ray] first checkpoint {first_checkpoint}; node 1 killed at "
        f"{killed_at - started:.0f} s, worker restarted; resumed at step "
        f"{summary['first_step']}; job 1 failed {jobs[0]['end_time'] / 1000 - killed_wall:.0f} s after the kill; "
        f"job 2 ran {(jobs[1]['end_time'] - jobs[1]['start_time']) / 1000:.0f} s; DAG run {report['wall_s']:.0f} s"
    )
