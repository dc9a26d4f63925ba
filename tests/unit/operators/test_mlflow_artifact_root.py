"""A local (sqlite) MLflow store keeps its artifacts beside the database, never in the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from areal_tasks.config.mlflow_paths import local_artifact_location

pytest.importorskip("mlflow")


def test_local_artifact_location() -> None:
    assert local_artifact_location("sqlite:////data/ml/mlflow.db") == "file:///data/ml/mlartifacts"
    assert local_artifact_location("sqlite:////data/ml/mlflow.db?timeout=5") == "file:///data/ml/mlartifacts"
    assert local_artifact_location("http://127.0.0.1:5000") is None


def test_hook_and_callback_experiments_live_beside_the_database(tmp_path: Path, monkeypatch) -> None:
    from mlflow import MlflowClient

    from areal_tasks.trainer.callbacks.mlflow import MLflowCallback
    from operators.hooks.mlflow import MlflowHook

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    (tmp_path / "db").mkdir()
    hook = MlflowHook(uri)
    run_id = hook.start_run("from-the-hook")
    hook.log_checkpoint_model(run_id, f"file://{tmp_path}", {"eval/reward": 0.5}, name="m", step=0)
    hook.end_run(run_id)
    callback = MLflowCallback(uri, "from-the-trainer")
    experiment_id = callback._get_or_create_experiment(MlflowClient(tracking_uri=uri))
    client = MlflowClient(tracking_uri=uri)
    for experiment in (client.get_experiment_by_name("from-the-hook"), client.get_experiment(experiment_id)):
        assert experiment.artifact_location == (tmp_path / "db" / "mlartifacts").as_uri()
    assert os.listdir(elsewhere) == []
    assert any((tmp_path / "db" / "mlartifacts").rglob("pointer.json"))
