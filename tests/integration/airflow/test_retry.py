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
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.airflow_server import AirflowClient, RestRun, job_records

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
    print(f"\n[test_retry] killed pid {rest_run.killed_pid} after checkpoints {rest_run.checkpoints_at_kill}; "
          f"the retry resumed at RL step {summary['first_step']} of {rest_run.rl_steps}")  # fmt: skip
