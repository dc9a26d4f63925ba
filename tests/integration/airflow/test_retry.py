"""A training worker killed mid-run: Airflow retries the ``train`` task and the job resumes, not restarts.

The session's ``rest_run`` (conftest.py) is the run: 4 SFT + 20 RL steps, a checkpoint every 4 RL
steps; once the job had a complete checkpoint, one of its RL train worker process groups got
SIGKILL (found from the job record; nothing else was touched). Then:

* the job's first attempt ended failed (the controller notices the dead rank and stops);
* the trigger reported it, the ``train`` task failed its first try, and Airflow retried it
  (``AREAL_DAG_RETRIES=1``, 2 s delay);
* the retry found the failed job and resubmitted it with ``recover.mode=auto`` (attempt 2 of the
  same job name, in the same run directory), which reused the SFT warm start and continued after
  the newest checkpoint: its first RL step is past the checkpoint seen before the kill, on a
  checkpoint boundary, and it ran only the remaining steps;
* the DAG run succeeded, ``train`` on try 2.

And the other way to stop a job: marking the deferred ``train`` task failed (what the UI's "mark
failed" does) cancels the job and every process it started (its own small run, stopped during SFT).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from areal_tasks.launch.jobs import LocalJobs
from tests.fixtures.airflow_server import AirflowClient, RestRun, descendants, job_records, pid_alive, wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow]

DAG_ID = "areal_rl_training"


@pytest.mark.timeout(1200)
def test_killed_training_worker_is_retried_and_resumes_from_checkpoint(
    airflow: AirflowClient, airflow_runs_dir: Path, rest_run: RestRun
) -> None:
    run_id = rest_run.run_id
    assert rest_run.final["state"] == "success", airflow.run_report(DAG_ID, run_id)

    tries = airflow.tries(DAG_ID, run_id, "train")
    assert [t["try_number"] for t in tries] == [1, 2], tries
    assert [t["state"] for t in tries] == ["failed", "success"], airflow.run_report(DAG_ID, run_id)

    # the same job name was submitted twice: the first attempt failed, the retry's succeeded
    attempts = [r for r in job_records(airflow_runs_dir) if r["name"] == rest_run.job_name]
    assert [r["attempt"] for r in attempts] == [1, 2], attempts
    exit_codes = [(Path(r["attempt_dir"]) / "exit_code").read_text().strip() for r in attempts]
    assert exit_codes[0] != "0" and exit_codes[1] == "0", exit_codes
    assert "recover.mode=auto" in attempts[1]["argv"] and "recover.mode=auto" not in attempts[0]["argv"]
    assert attempts[0]["run_dir"] == attempts[1]["run_dir"]

    # it resumed from a checkpoint at least as new as the one seen before the kill, and did not redo SFT
    summary = airflow.xcom(DAG_ID, run_id, "train")["summary"]
    resumed_after = summary["first_step"] - 1
    assert resumed_after >= max(rest_run.checkpoints_at_kill), (summary["first_step"], rest_run.checkpoints_at_kill)
    assert resumed_after % rest_run.save_every == 0 and resumed_after < rest_run.rl_steps, summary["first_step"]
    assert summary["steps"] == rest_run.rl_steps and summary["final_version"] == rest_run.rl_steps
    assert summary.get("sft_reused") is True, {k: v for k, v in summary.items() if k.startswith("sft")}
    print(
        f"\n[test_retry] killed pid {rest_run.killed_pid} after checkpoints {rest_run.checkpoints_at_kill}; "
        f"the retry resumed at RL step {summary['first_step']} of {rest_run.rl_steps}"
    )


@pytest.mark.timeout(600)
def test_marking_the_deferred_train_task_failed_cancels_its_job(
    airflow: AirflowClient, airflow_runs_dir: Path, tmp_path: Path
) -> None:
    """What a user does in the UI to stop a training: mark the (deferred) ``train`` task failed.

    The triggerer cancels the trigger, whose ``on_kill`` cancels the job: its record says
    ``cancelled`` and no process it started (wrapper, controller, workers, servers) is left.
    """
    tag = uuid.uuid4().hex[:8]
    run_id = f"cancel_{tag}"
    conf = {
        "config": "configs/demo_grpo.yaml",
        "experiment_name": f"it-cancel-{tag}",
        "sft_steps": 100,
        "max_steps": 110,
        "storage_url": (tmp_path / "storage").as_uri(),
    }
    started = time.monotonic()
    airflow.trigger(DAG_ID, conf, run_id=run_id)

    def deferred_with_running_job() -> dict | None:
        train = airflow.task_instance(DAG_ID, run_id, "train")
        if train["state"] in ("failed", "upstream_failed", "success"):
            raise AssertionError(
                f"train ended ({train['state']}) before it could be cancelled\n{airflow.run_report(DAG_ID, run_id)}"
            )
        records = [r for r in job_records(airflow_runs_dir) if run_id in r["name"]]
        return records[0] if records and train["state"] == "deferred" else None

    record = wait_for(deferred_with_running_job, 300, f"the train task of {run_id} to defer on its job", poll_s=0.5)
    jobs = LocalJobs(record["jobs_root"])
    assert jobs.status(record["name"]).state == "running"
    # the job's processes (the workers lead sessions of their own: not in the wrapper's group)
    wait_for(lambda: len(descendants(int(record["pid"]))) >= 3, 60, "the job to start its workers", poll_s=0.2)
    processes = [int(record["pid"]), *descendants(int(record["pid"]))]

    airflow.request("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
    marked = time.monotonic()
    status = wait_for(lambda: (s := jobs.status(record["name"])).terminal and s, 60, "the job to end", poll_s=0.5)
    assert status.state == "cancelled", status
    gone = wait_for(lambda: not [p for p in processes if pid_alive(p)], 30, "the job's processes to exit", poll_s=0.2)
    assert gone
    cancel_s = time.monotonic() - marked

    # let the run finish what it does after a failure (the MLflow run ends FAILED), then nothing runs
    def settled() -> bool:
        active = {"running", "queued", "scheduled", "deferred", "up_for_retry", "restarting"}
        return not [ti for ti in airflow.task_instances(DAG_ID, run_id) if ti["state"] in active]

    wait_for(settled, 120, f"the tasks of {run_id} to stop", poll_s=1.0)
    assert airflow.task_instance(DAG_ID, run_id, "train")["state"] == "failed"
    print(
        f"\n[test_retry] marked train failed at {marked - started:.1f}s; job {status.state} and its "
        f"{len(processes)} processes gone {cancel_s:.1f}s later; run settled at {time.monotonic() - started:.1f}s"
    )
