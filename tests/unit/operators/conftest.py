"""Fixtures for the operator tests: a jobs root whose jobs are all cancelled (by process group) at
teardown, the fake trainer's command line, and a task-instance context like Airflow's."""

from __future__ import annotations

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


def make_context(dag_id: str = "areal_rl_training", run_id: str = "manual__2026-01-02T03:04:05+00:00",
                 task_id: str = "train", map_index: int = -1) -> dict[str, Any]:  # fmt: skip
    """The part of an Airflow task context the operators read: ``ti`` with its ids."""
    ti = SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index, try_number=1)
    return {"ti": ti, "run_id": run_id}
