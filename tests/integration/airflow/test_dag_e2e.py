"""The whole ``areal_rl_training`` DAG with ``dag.test()`` on a tiny run: every task, for real.

One DAG run of the demo task at a tiny size (10 SFT steps, 3 GRPO steps of 16 samples, 4 eval
prompts) goes through every task: the job is resolved and validated, the storage checked, the model
detected, the resources checked, the MLflow run created, the training job submitted as a detached
local job and waited for by the trigger (run inline by ``dag.test()``), the final checkpoint
evaluated and registered, the summary written. Then the test reads what the run left behind: the task states in
Airflow's database, the checkpoint on disk, the MLflow run (params, metrics, FINISHED) and the
registered model version with its aliases (``candidate`` and, being the first, ``champion``).

``dag.test()`` runs in a child interpreter with its own ``AIRFLOW_HOME`` (SQLite), so the Airflow
configuration of the pytest process (or of other tests) does not matter. About 1-2 minutes on 2
cores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.fixtures.dag_runner import DAG_ID, dag_env, run_dag_test

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow]

MODEL_NAME = "areal-e2e-policy"
SFT_STEPS = 10
RL_STEPS = 3


@pytest.fixture(scope="module")
def dag_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the DAG once; ``{state, run_id, tasks, run_dir, tracking_uri, summary}``."""
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    pytest.importorskip("mlflow", reason="MLflow is not installed: pip install -e '.[tracking]'")
    base = tmp_path_factory.mktemp("dag_e2e")
    run_dir = base / "run"
    tracking_uri = f"sqlite:///{base / 'mlflow.db'}"
    conf = {
        "config": "configs/demo_grpo.yaml",
        "run_dir": str(run_dir),
        "sft_steps": SFT_STEPS,
        "max_steps": SFT_STEPS + RL_STEPS,
        "eval_prompts": 4,
        "registered_model_name": MODEL_NAME,
        # 2 prompts x 8 samples a step (and 16 demonstrations a SFT step): the pipeline, not learning
        "extra_overrides": ["train.batch_size=16"],
    }
    report = run_dag_test(base, conf, dag_env(base, tracking_uri))
    wall = report["wall_s"]
    print(f"\n[dag_e2e] {DAG_ID} with dag.test(): {wall:.0f} s (log {base / 'dag_test.log'})")
    summary_path = run_dir / "summary.json"
    report.update(
        run_dir=run_dir,
        tracking_uri=tracking_uri,
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else None,
    )
    return report


def test_every_task_succeeded(dag_run: dict[str, Any]) -> None:
    tasks = dag_run["tasks"]
    expected = {
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
    assert expected <= set(tasks), f"tasks that did not run: {sorted(expected - set(tasks))}"
    failed = {k: v for k, v in tasks.items() if k in expected and v != "success"}
    assert not failed, f"tasks not successful: {failed}\n{dag_run['log'][-6000:]}"
    assert tasks.get("fail_mlflow_run") == "skipped", "the failure clean-up ran although nothing failed"
    assert dag_run["state"].endswith("success")


def test_summary_holds_the_pipeline_figures(dag_run: dict[str, Any]) -> None:
    summary = dag_run["summary"]
    assert summary is not None, f"no summary.json in {dag_run['run_dir']}"
    for key in ("reward_before", "reward_after"):
        assert 0.0 <= summary[key] <= 1.0, (key, summary[key])
    assert summary["steps"] == RL_STEPS
    assert summary["registered_model_name"] == MODEL_NAME
    assert summary["airflow_run_id"] == dag_run["run_id"]
    assert summary["evaluations"] and summary["evaluations"][0]["checkpoint"] == summary["checkpoint"]


def test_the_final_checkpoint_exists(dag_run: dict[str, Any]) -> None:
    url = dag_run["summary"]["checkpoint"]
    parsed = urlparse(url)
    path = Path(parsed.path if parsed.scheme == "file" else url)
    assert path.is_dir(), f"checkpoint {url} is not a directory"
    assert path.name.startswith("step_") and any(path.iterdir()), f"checkpoint {url} is empty"
    assert str(path).startswith(str(dag_run["run_dir"])), "the checkpoint is not under the run's storage"


def test_the_mlflow_run_holds_params_and_metrics(dag_run: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=dag_run["tracking_uri"])
    run = client.get_run(dag_run["summary"]["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["train.total_steps"] == str(SFT_STEPS + RL_STEPS)  # the trainer's callback: the job config
    assert params["airflow.max_steps"] == str(SFT_STEPS + RL_STEPS)  # the DAG: its Params
    assert run.data.tags["airflow.dag_id"] == DAG_ID
    metrics = run.data.metrics
    assert "reward/mean" in metrics, sorted(metrics)
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert len(history) == RL_STEPS, [m.step for m in history]
    assert any(key.startswith("eval") for key in metrics), sorted(metrics)


def test_the_model_is_registered_as_candidate_and_first_champion(dag_run: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    summary = dag_run["summary"]
    client = MlflowClient(tracking_uri=dag_run["tracking_uri"], registry_uri=dag_run["tracking_uri"])
    version = str(summary["registered_model_version"])
    candidate = client.get_model_version_by_alias(MODEL_NAME, "candidate")
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert str(candidate.version) == version == str(champion.version) == "1"
    assert set(summary["registered_model_aliases"]) >= {"candidate", "champion"}
    assert candidate.run_id == summary["mlflow_run_id"]
