"""Fixtures for the scheduler tests: the worker program and schedulers that clean up after themselves.

``scheduler`` is parametrized by kind so that the contract tests run against every backend that can
run on a single CPU machine (today: ``local``).
"""

from __future__ import annotations

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


@pytest.fixture(params=["local"])
def scheduler(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scheduler]:
    """A scheduler of each testable kind, stopped (all groups) after the test."""
    sched = make_scheduler(request.param, run_dir=tmp_path / "run", devices=[], handle_signals=False)
    try:
        yield sched
    finally:
        sched.stop_all(grace_s=2.0)
