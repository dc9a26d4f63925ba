"""Fixtures for the operator tests: a jobs root whose jobs are all cancelled (by process group) at
teardown, the fake trainer's command line, a task-instance context like Airflow's, and a fresh
local MLflow store (sqlite + file artifacts) per test with a pipeline run in it."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from areal_tasks.launch.jobs import LocalJobs

FAKE_TRAIN = Path(__file__).with_name("fake_train.py")


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[LocalJobs]:
    """A LocalJobs under ``tmp_path/jobs``; every job still running at teardown is cancelled."""
    local = LocalJobs(tmp_path / "jobs")
    try:
        yield local
    finally:
        if local.root.is_dir():
            for folder in local.root.iterdir():
                if folder.is_dir() and local.status(folder.name).state == "running":
                    local.cancel(folder.name, grace_s=2.0)


@pytest.fixture
def fake_train_command() -> list[str]:
    """What the training operator runs instead of ``areal train`` (see fake_train.py)."""
    return [sys.executable, str(FAKE_TRAIN)]


def make_context(
    dag_id: str = "areal_rl_training",
    run_id: str = "manual__2026-01-02T03:04:05+00:00",
    task_id: str = "train",
    map_index: int = -1,
) -> dict[str, Any]:
    """The part of an Airflow task context the operators read: ``ti`` with its ids."""
    ti = SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index, try_number=1)
    return {"ti": ti, "run_id": run_id}


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, migrated MLflow sqlite database (creating the tables takes seconds; copying is instant)."""
    mlflow = pytest.importorskip("mlflow")
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(mlflow_template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """``uri``, ``hook`` (an MlflowHook), ``run_id`` (a run in experiment areal-test), ``client``, ``tmp``."""
    import mlflow

    from operators.hooks.mlflow import MlflowHook

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template_db, db)
    monkeypatch.chdir(tmp_path)  # MLflow's fallback artifact root is ./mlruns
    uri = f"sqlite:///{db}"
    hook = MlflowHook(uri)
    run_id = hook.start_run(
        "areal-test", "pipeline", {"areal.dag_id": "d"}, artifact_location=(tmp_path / "art").as_uri()
    )
    return SimpleNamespace(uri=uri, hook=hook, run_id=run_id, client=mlflow.MlflowClient(uri), tmp=tmp_path)
