"""The ``areal_rl_training`` DAG against the namespace SLURM cluster: a lost worker node, a retry that resumes.

``dag.test()`` (tests/fixtures/dag_runner.py) runs the whole DAG with ``scheduler=slurm`` and
``nodes=2``; the cluster comes from the connection ``areal_slurm`` given as
``$AIRFLOW_CONN_AREAL_SLURM``. The job is a few RL steps from the session's SFT warm start with a
checkpoint after every step, and the ``train`` task has one retry.

Once the first complete checkpoint is in the run's storage, node 1 is killed: its namespace init
gets SIGKILL, which takes its slurmd and the job's rank 1 (the train rank placed there) with it.
The controller, on node 0, sees rank 1's step end and fails the job; the node is then brought back
(``restart_node``: a fresh init and slurmd, idle again). The assertions: the job's first attempt
failed, the ``train`` task failed its try 1 and succeeded on try 2 (Airflow's own task history),
the second attempt was submitted with ``recover.mode=auto`` and started after the checkpointed step
(not at step 1), every task of the DAG succeeded, and a model version is registered in MLflow.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.fixtures.dag_runner import dag_env, finish_dag_test, start_dag_test
from tests.fixtures.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slurm, pytest.mark.airflow, pytest.mark.slow]

MODEL_NAME = "areal-slurm-policy"
EXPECTED_TASKS = {
    "resolve_job",
    "validate_storage",
    "detect_model",
    "provision_cluster",
    "start_mlflow_run",
    "train",
    "checkpoints_to_evaluate",
    "evaluate_checkpoint[0]",
    "register_model",
    "finish_pipeline",
}
RL_STEPS = 4
#: bounded waits: the DAG run end to end, and the first checkpoint.
DAG_TIMEOUT_S = 900.0
CHECKPOINT_WAIT_S = 600.0


def _complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps with a complete checkpoint under ``run_dir`` so far, walked again when a directory
    vanishes mid-walk (the storage check's scratch directory comes and goes while the job runs)."""
    for _ in range(20):
        try:
            return sorted(int(p.parent.name.split("_")[1]) for p in run_dir.rglob("checkpoints/step_*/_COMPLETE"))
        except FileNotFoundError:
            time.sleep(0.05)
    raise AssertionError(f"{run_dir} kept changing under 20 walks for its checkpoints")


def _attempts(jobs_root: Path) -> list[dict]:
    records = [json.loads(p.read_text()) for p in jobs_root.glob("*/attempt_*/job.json")]
    return sorted(records, key=lambda r: r["attempt"])


def _exit_code(jobs_root: Path, record: dict) -> str | None:
    path = jobs_root / record["name"] / f"attempt_{record['attempt']}" / "exit_code"
    return path.read_text().strip() if path.is_file() else None


def _train_tries(airflow_db: Path) -> list[tuple[int, str]]:
    """``(try_number, state)`` of every try of ``train`` in the child's Airflow database, oldest first."""
    with sqlite3.connect(airflow_db) as db:
        rows = db.execute(
            "SELECT try_number, state FROM task_instance_history WHERE task_id = 'train' "
            "UNION SELECT try_number, state FROM task_instance WHERE task_id = 'train' ORDER BY 1"
        ).fetchall()
    return [(int(n), str(s)) for n, s in rows]


@pytest.mark.timeout(1500)
@pytest.mark.kills_nodes
def test_dag_on_slurm_survives_a_lost_worker_node(slurm_cluster: SlurmCluster, warm_start: str, tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    pytest.importorskip("mlflow", reason="MLflow is not installed: pip install -e '.[tracking]'")
    run_dir, jobs_root = tmp_path / "run", tmp_path / "jobs"
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    connection = {
        "conn_type": "generic",
        "extra": {"slurm_conf": str(slurm_cluster.conf), "partition": slurm_cluster.partition},
    }
    env = dag_env(
        tmp_path,
        tracking_uri,
        {
            "AIRFLOW_CONN_AREAL_SLURM": json.dumps(connection),
            "SLURM_CONF": str(slurm_cluster.conf),
            "AREAL_DAG_RETRIES": "1",
            "AREAL_DAG_RETRY_DELAY_S": "1",
        },
    )
    conf = {
        "config": "configs/demo_grpo.yaml",
        "model": warm_start,
        "run_dir": str(run_dir),
        "sft_steps": 0,
        "max_steps": RL_STEPS,
        "eval_prompts": 8,
        "scheduler": "slurm",
        "nodes": 2,
        "registered_model_name": MODEL_NAME,
        # 2 prompts x 8 samples a step: the pipeline and the retry, not learning (test_train_slurm)
        "extra_overrides": ["train.batch_size=16", "saver.freq_steps=1"],
    }
    started = time.perf_counter()
    child = start_dag_test(tmp_path, conf, env)
    try:
        deadline = time.monotonic() + CHECKPOINT_WAIT_S
        while not _complete_checkpoints(run_dir):
            assert child.poll() is None, (tmp_path / "dag_test.log").read_text()[-6000:]
            assert time.monotonic() < deadline, f"no complete checkpoint under {run_dir} in {CHECKPOINT_WAIT_S} s"
            time.sleep(0.2)
        at_kill = _complete_checkpoints(run_dir)
        killed_at = time.perf_counter()
        slurm_cluster.nodes[1].kill()  # SIGKILL to node 1's init: its slurmd and rank 1 go with it
        (first,) = _attempts(jobs_root)
        while _exit_code(jobs_root, first) is None:  # the controller on node 0 fails the job
            assert time.monotonic() < deadline + DAG_TIMEOUT_S, "the job never ended after node 1 was killed"
            time.sleep(0.2)
        detect_s = time.perf_counter() - killed_at
        slurm_cluster.restart_node(1, timeout=120.0)  # a fresh init and slurmd: the retry finds 2 nodes
        restarted_at = time.perf_counter()
        report = finish_dag_test(tmp_path, child, DAG_TIMEOUT_S, started)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    retry_s = time.perf_counter() - restarted_at
    log = report["log"]

    tasks = report["tasks"]
    assert set(tasks) >= EXPECTED_TASKS, f"tasks that did not run: {sorted(EXPECTED_TASKS - set(tasks))}"
    failed = {k: v for k, v in tasks.items() if k in EXPECTED_TASKS and v != "success"}
    assert not failed, f"tasks not successful: {failed}\n{log[-6000:]}"
    assert {tasks.get("fail_mlflow_run"), tasks.get("pipeline_failed")} == {"skipped"}, tasks  # no failure path
    assert report["state"].endswith("success"), log[-6000:]
    assert _train_tries(tmp_path / "airflow" / "airflow.db") == [(1, "failed"), (2, "success")]

    attempts = _attempts(jobs_root)
    assert [r["attempt"] for r in attempts] == [1, 2], attempts
    assert _exit_code(jobs_root, attempts[0]) != "0" and _exit_code(jobs_root, attempts[1]) == "0"
    assert "recover.mode=auto" in attempts[1]["argv"] and "recover.mode=auto" not in attempts[0]["argv"]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["first_step"] - 1 >= max(at_kill), (summary["first_step"], at_kill)  # resumed, not step 1
    assert summary["first_step"] > 1 and summary["steps"] == RL_STEPS, summary
    assert summary["placement"]["actor"] == [n.name for n in slurm_cluster.nodes], summary["placement"]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    version = client.get_model_version_by_alias(MODEL_NAME, "candidate")
    assert str(version.version) == str(summary["registered_model_version"]) == "1"
    print(
        f"\n[test_dag_slurm] node 1 killed after checkpoint(s) {at_kill}: the job failed {detect_s:.1f} s later; "
        f"the retry resumed at step {summary['first_step']} and the DAG ended {retry_s:.0f} s after the node "
        f"was back; DAG run {report['wall_s']:.0f} s"
    )
