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


def test_a_worker_plan_carries_the_controllers_env_minus_node_local_parts(tmp_path: Path) -> None:
    from areal_tasks.api.scheduler import NodeInfo, ReadinessCheck, WorkerGroupSpec, WorkerInfo
    from areal_tasks.launch.ray.plan import plan_worker

    nodes = [NodeInfo(0, "n0", "10.0.0.10", 4, 0), NodeInfo(1, "n1", "10.0.0.11", 4, 0)]
    spec = WorkerGroupSpec(
        name="train",
        command=["python", "w.py", "{host}:{port}", "{node}", "{rank}/{world_size}"],
        env={"MY_PORT": "{port}"},
        replicas=2,
        torch_distributed=True,
        placement=[0, 1],
        readiness=ReadinessCheck.file("ready-{rank}"),
    )
    info = WorkerInfo(group="train", rank=1, host="10.0.0.11", ports=[7001], log_path="x", node=1)
    controller = {
        "PATH": "/usr/bin",
        "AREAL_CONFIG_SECRETS": "s",
        "RAY_ADDRESS": "10.0.0.10:6379",
        "CUDA_VISIBLE_DEVICES": "0",
        "AREAL_PROCESS_MARKERS": "job-1",
        "AREAL_NODE_ADDR": "10.0.0.10",
    }
    plan = plan_worker(spec, info, nodes, 6000, tmp_path, controller, "/srv/proj")
    assert plan.argv == ["python", "w.py", "10.0.0.11:7001", "1", "1/2"]
    assert plan.cwd == "/srv/proj" and plan.ready_target == "/srv/proj/ready-1"
    env = plan.env
    assert env["PATH"] == "/usr/bin" and env["AREAL_CONFIG_SECRETS"] == "s" and env["MY_PORT"] == "7001"
    assert not {"RAY_ADDRESS", "CUDA_VISIBLE_DEVICES", "AREAL_PROCESS_MARKERS"} & set(env)
    assert env["AREAL_NODE_ADDR"] == "10.0.0.11" and env["MASTER_ADDR"] == "10.0.0.10"
    assert (env["MASTER_PORT"], env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"]) == ("6000", "1", "1", "0")
