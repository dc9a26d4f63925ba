"""Fixtures for the scheduler tests: the worker program and schedulers that clean up after themselves.

``scheduler`` is parametrized by kind so that the contract tests run against every backend that can
run on a single CPU machine (today: ``local``). ``AREAL_TEST_SCHEDULER=ray`` runs them against a
``RayScheduler`` instead (on ``address=auto``, ``AREAL_TEST_RAY_NODES`` nodes, default 2): the Ray
integration tests do that inside a node of their namespace Ray cluster
(``tests/integration/cluster/test_ray_scheduler.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import Scheduler
from areal_tasks.launch import make_scheduler

WORKER = Path(__file__).with_name("worker.py")


@pytest.fixture
def worker_cmd() -> Callable[..., list[str]]:
    """``worker_cmd("http", "{port}")`` -> the command line running worker.py in that mode."""

    def build(*args: str) -> list[str]:
        return [sys.executable, str(WORKER), *args]

    return build


#: the scheduler kind the contract runs against (``local`` unless the environment says otherwise).
SCHEDULER_KIND = os.environ.get("AREAL_TEST_SCHEDULER", "local")


def _make(kind: str, run_dir: Path) -> Scheduler:
    if kind == "ray":
        return make_scheduler(
            "ray",
            run_dir=run_dir,
            nodes=int(os.environ.get("AREAL_TEST_RAY_NODES", "2")),
            placement_timeout_s=30.0,
            call_timeout_s=30.0,
            handle_signals=False,
        )
    return make_scheduler(kind, run_dir=run_dir, devices=[], handle_signals=False)


@pytest.fixture(params=[SCHEDULER_KIND])
def scheduler(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scheduler]:
    """A scheduler of each testable kind, stopped (all groups) after the test."""
    sched = _make(request.param, tmp_path / "run")
    try:
        yield sched
    finally:
        sched.stop_all(grace_s=2.0)
