"""``areal_rl_training`` triggered over Airflow's REST API on a live standalone, tracked in a live MLflow.

The session's ``rest_run`` (conftest.py: ``POST /api/v2/dags/areal_rl_training/dagRuns`` with a tiny
conf; its training worker is killed once, which test_retry.py looks at) must succeed, and then the
places a user looks must agree with each other:

* the run carries the conf it was triggered with, and every task but ``train`` succeeded on its
  first try;
* the ``train`` task's XCom names the MLflow run that holds the job's stepped metrics (the trainer's
  MLflow callback attached to the run the DAG created, on both job attempts: every RL step is there,
  save the checkpointed step the kill may have cut short), in the experiment the conf named, on the
  live MLflow server that Airflow reaches through its ``areal_mlflow`` connection;
* the registered model (a fresh name) has a version with the alias ``candidate`` and, being the
  first registration, ``champion``; that version belongs to the same MLflow run and points at the
  job's final checkpoint, which is complete in the storage the conf chose;
* the run directory's ``summary.json`` holds the same run id and version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.airflow_server import AirflowClient, RestRun
from tests.fixtures.mlflow_server import MlflowServer

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow]

DAG_ID = "areal_rl_training"


@pytest.mark.timeout(1200)
def test_rest_triggered_run_trains_registers_and_tracks(
    airflow: AirflowClient, mlflow_server: MlflowServer, rest_run: RestRun
) -> None:
    run_id = rest_run.run_id
    assert rest_run.created["dag_run_id"] == run_id and rest_run.created["conf"] == rest_run.conf
    assert rest_run.final["state"] == "success", airflow.run_report(DAG_ID, run_id)

    instances = airflow.task_instances(DAG_ID, run_id)
    states = {(ti["task_id"], ti["map_index"]): (ti["state"], ti["try_number"]) for ti in instances}
    for task_id in (
        "resolve_job",
        "validate_storage",
        "detect_model",
        "provision_cluster",
        "start_mlflow_run",
        "register_model",
        "finish_pipeline",
    ):
        assert states.get((task_id, -1)) == ("success", 1), airflow.run_report(DAG_ID, run_id)
    evaluations = [key for key in states if key[0] == "evaluate_checkpoint"]
    assert evaluations and all(states[key][0] == "success" for key in evaluations), airflow.run_report(DAG_ID, run_id)

    # the training task's XCom names the MLflow run that holds the job's metrics
    train = airflow.xcom(DAG_ID, run_id, "train")
    mlflow_run_id = train["mlflow_run_id"]
    client = mlflow_server.client()
    tracked = client.get_run(mlflow_run_id)
    assert client.get_experiment(tracked.info.experiment_id).name == rest_run.experiment
    assert tracked.data.tags.get("airflow.run_id") == run_id
    steps = {m.step for m in client.get_metric_history(mlflow_run_id, "reward/mean")}
    # every RL step, from both job attempts; the step whose checkpoint the killed attempt committed
    # may lack its row (the trainer logs a step's metrics after saving its checkpoint, and the kill
    # can land in between; the retry resumes after that checkpoint)
    resumed_after = train["summary"]["first_step"] - 1
    missing, extra = set(range(1, rest_run.rl_steps + 1)) - steps, steps - set(range(1, rest_run.rl_steps + 1))
    assert not extra and missing <= {resumed_after}, f"reward/mean steps in MLflow run {mlflow_run_id}: {sorted(steps)}"
    assert tracked.info.status == "FINISHED"

    # the final checkpoint is complete, in the storage the conf chose
    final = train["final_checkpoint"]
    assert final in train["checkpoints"], train
    assert final.startswith(rest_run.storage.as_uri()), (final, rest_run.storage.as_uri())
    assert (Path(final.removeprefix("file://")) / "_COMPLETE").is_file(), f"{final} is not a complete checkpoint"
    assert final.rstrip("/").endswith(f"step_{rest_run.rl_steps}")

    # the registry: candidate and, on the first registration, champion; same run, same checkpoint
    registered = airflow.xcom(DAG_ID, run_id, "register_model")
    candidate = client.get_model_version_by_alias(rest_run.model_name, "candidate")
    champion = client.get_model_version_by_alias(rest_run.model_name, "champion")
    assert candidate.version == champion.version == str(registered["version"]) == "1"
    assert registered["champion_changed"] is True and sorted(registered["aliases"]) == ["candidate", "champion"]
    assert candidate.run_id == mlflow_run_id
    assert candidate.tags["areal.checkpoint_url"] == final

    summary = json.loads((Path(train["run_dir"]) / "summary.json").read_text())
    assert summary["mlflow_run_id"] == mlflow_run_id
    assert str(summary["registered_model_version"]) == candidate.version
    print(
        f"\n[test_rest_trigger] run {run_id} ({rest_run.seconds:.0f}s): MLflow run {mlflow_run_id}, "
        f"{rest_run.model_name} v{candidate.version} {sorted(registered['aliases'])}"
    )
