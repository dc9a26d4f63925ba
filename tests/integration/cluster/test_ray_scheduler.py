"""RayScheduler on the 2-node namespace Ray cluster (design-27 4.1 and 10.1); drivers run in node 0.

The scheduler contract (tests/unit/launch/test_scheduler_contract.py) against ``ray``; no orphan
when a supervisor actor is killed; and, last because it kills node 1 (restarted after),
a lost node turned into WorkerFailedError naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.ray_cluster import RayCluster

pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.integration, pytest.mark.timeout(240)]

DRIVER = str(Path(__file__).with_name("ray_driver.py"))


def _drive(ray_cluster: RayCluster, *args: str, timeout: float = 180.0) -> None:
    done = ray_cluster.driver([sys.executable, DRIVER, *args], timeout=timeout)
    assert done.returncode == 0, (
        f"driver {args[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )


def test_the_scheduler_contract_passes_on_ray(ray_cluster: RayCluster, tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests/unit/launch/test_scheduler_contract.py",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={tmp_path / 'contract'}",
    ]
    done = ray_cluster.driver(argv, env={"AREAL_TEST_SCHEDULER": "ray"}, timeout=200)
    assert done.returncode == 0, f"contract on ray failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert "[ray]" in done.stdout or "passed" in done.stdout


def test_a_killed_supervisor_leaves_no_orphan(ray_cluster: RayCluster, tmp_path: Path) -> None:
    out = tmp_path / "orphan.json"
    _drive(ray_cluster, "orphan", str(out))
    assert json.loads(out.read_text()) == {"before": True, "after": False}


@pytest.mark.kills_nodes
def test_a_lost_node_fails_its_worker_naming_the_node(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Kills node 1, then brings it (and its Ray worker) back; last in this module all the same."""
    ready, out = tmp_path / "ready", tmp_path / "lost.json"
    proc = subprocess.Popen(
        ray_cluster.head.command([sys.executable, DRIVER, "node-loss", str(ready), str(out)], ray_cluster.repo_root),
        env=ray_cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert proc.poll() is None, f"driver exited early:\n{proc.stdout.read() if proc.stdout else ''}"
            assert time.monotonic() < deadline, "the driver did not start its worker on node 1"
            time.sleep(0.1)
        lost = ray_cluster.netns.nodes[1]
        lost.kill()
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ray_cluster.restart_worker()  # node 1 and its Ray worker back, for the tests after this one
    assert proc.returncode == 0, output[-4000:]
    result = json.loads(out.read_text())
    assert result["failed"], result
    assert f"node 1 ({lost.name}, {lost.address})" in result["message"]
    assert "far/0" in result["message"]
