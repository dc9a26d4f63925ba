"""RayJobs from the host (the login node) against the namespace Ray cluster's Jobs API (design-27 4.2).

Submit and look up by name, attempt 2 after a failure (Ray never reuses a submission id), a failed
job's exit code and log tail, refusal while running, cancel, and a name never submitted. And the
path a real job takes: a submitted job is a Ray driver (``RAY_ADDRESS`` set by the Jobs API) that
runs the RayScheduler, here 2 ranks with placement [0, 1] all-reducing over gloo across the nodes
(MASTER_ADDR = node 0, AREAL_NODE_ADDR per node, the socket interface pinned from it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.errors import SchedulerError
from areal_tasks.launch.ray import preflight
from areal_tasks.launch.ray.jobs import RayJobs
from areal_tasks.launch.ray.rest import RayDashboard
from tests.fixtures.ray_cluster import RayCluster

DRIVER = str(Path(__file__).with_name("ray_driver.py"))

pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.integration, pytest.mark.timeout(180)]


def _until_terminal(jobs: RayJobs, name: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = jobs.status(name)
        if status.terminal or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_submit_fail_retry_cancel_and_lookup(ray_cluster: RayCluster) -> None:
    jobs = RayJobs(ray_cluster.dashboard_url, request_timeout_s=10, stop_wait_s=15)
    name = "exp-ray-jobs"
    assert jobs.status(name).state == "missing"
    crash = "import os, sys; print('token', os.environ['AREAL_TEST_ENV']); print('boom: bad config'); sys.exit(4)"
    first = jobs.submit(
        name,
        [sys.executable, "-c", crash],
        env={"AREAL_TEST_ENV": "v1"},
        run_dir="/tmp/r",
        cwd=str(ray_cluster.repo_root),
    )
    assert (first.state, first.attempt, first.job_id) == ("running", 1, f"{name}--1")
    failed = _until_terminal(jobs, name)
    assert (failed.state, failed.exit_code, failed.run_dir) == ("failed", 4, "/tmp/r")
    assert "boom: bad config" in failed.reason and "boom: bad config" in jobs.log_tail(name)
    assert "token v1" in jobs.log_tail(name)  # the env reached the job

    second = jobs.submit(name, [sys.executable, "-c", "import time; time.sleep(120)"], cwd="/tmp")
    assert (second.attempt, second.job_id) == (2, f"{name}--2")
    with pytest.raises(SchedulerError, match="already running"):
        jobs.submit(name, ["true"])
    assert jobs.status(name).attempt == 2
    cancelled = jobs.cancel(name, grace_s=5)
    assert cancelled.state == "cancelled" and cancelled.attempt == 2

    third = jobs.submit(name, [sys.executable, "-c", "print('fine')"])
    done = _until_terminal(jobs, name)
    assert (third.attempt, done.state, done.exit_code) == (3, "succeeded", 0)
    assert RayJobs(ray_cluster.dashboard_url).status(name).attempt == 3  # a new client finds it by name


def test_preflight_sees_the_two_nodes_from_the_host(ray_cluster: RayCluster) -> None:
    board = RayDashboard(ray_cluster.dashboard_url, timeout_s=10)
    report = preflight.check_resources(board, nodes=2, cpus_per_node=2)
    assert report["fit"] == 2 and {n["address"] for n in report["nodes"]} == {
        n.address for n in ray_cluster.netns.nodes
    }
    with pytest.raises(SchedulerError, match=r"has 2 alive node\(s\) .*asks for 3"):
        preflight.check_resources(board, nodes=3)


def test_a_submitted_job_drives_the_scheduler_gloo_across_two_nodes(ray_cluster: RayCluster, tmp_path: Path) -> None:
    jobs = RayJobs(ray_cluster.dashboard_url, request_timeout_s=10)
    out = tmp_path / "gloo.json"
    jobs.submit("exp-ray-gloo", [sys.executable, DRIVER, "gloo", str(out)], cwd=str(ray_cluster.repo_root))
    done = _until_terminal(jobs, "exp-ray-gloo", timeout=150)
    assert done.state == "succeeded", f"{done.reason}\n{jobs.log_tail('exp-ray-gloo', 60)}"
    result = json.loads(out.read_text())
    head, worker = (n.address for n in ray_cluster.netns.nodes)
    assert result["nodes"] == [head, worker] and result["status"] == ["succeeded", "succeeded"]
    assert [r["sum"] for r in result["ranks"]] == [3.0, 3.0]
    assert {r["MASTER_ADDR"] for r in result["ranks"]} == {head}
    assert [r["AREAL_NODE_ADDR"] for r in result["ranks"]] == [head, worker]
    assert [(r["NODE_RANK"], r["LOCAL_RANK"]) for r in result["ranks"]] == [("0", "0"), ("1", "0")]
    assert {r["GLOO_SOCKET_IFNAME"] for r in result["ranks"]} == {"eth0"}
