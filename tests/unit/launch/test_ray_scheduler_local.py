"""The Ray scheduler's parts that need no Ray cluster: where a driver may run (checked without
``ray.init``), the refusal off the cluster, and the supervisor's port picking."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("ray")

from areal_tasks.config.job import JobConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.ray.scheduler import RayScheduler, on_ray_node
from areal_tasks.launch.ray.supervisor import free_ports


def test_a_driver_may_run_only_on_a_ray_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not on_ray_node(str(tmp_path))  # no raylet session here
    sockets = tmp_path / "session_latest" / "sockets"
    sockets.mkdir(parents=True)
    (sockets / "raylet").write_text("")  # a stale file, not a live socket
    assert not on_ray_node(str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")  # a dashboard URL is not a node
    assert not on_ray_node(str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.10:6379")  # set by the Jobs API for an entrypoint
    assert on_ray_node(str(tmp_path))


def test_the_scheduler_refuses_off_the_cluster_without_calling_ray_init(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray"))
    assert RayScheduler.can_run_controller_here(JobConfig()) is False
    with pytest.raises(SchedulerError, match="not a node of the Ray cluster.*areal launch ray"):
        RayScheduler(tmp_path / "run")


def test_free_ports_skip_the_excluded_ones() -> None:
    taken = set(free_ports(5, "127.0.0.1"))
    again = free_ports(5, "127.0.0.1", exclude=taken)
    assert len(set(again)) == 5 and not taken & set(again)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", again[0]))  # it was free
