"""SlurmScheduler's own allocation and the loss of a node, against ``slurm_cluster``.

Separate from ``test_slurm_scheduler.py``, whose module-wide allocation holds both nodes. The
node-loss test kills node 1 (its slurmd and the worker's task with it) and then restarts the node
and its slurmd, so the tests after it find the cluster whole again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import ReadinessCheck, WorkerGroupSpec, WorkerStatus
from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import WorkerFailedError
from areal_tasks.launch.slurm import SlurmScheduler
from tests.fixtures.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

WORKER = Path(__file__).parents[2] / "unit" / "launch" / "worker.py"
WAIT_S = 60.0


def _slurm(cluster: SlurmCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, timeout=30)


def _scheduler(cluster: SlurmCluster, run_dir: Path) -> SlurmScheduler:
    config = SlurmConfig(slurm_conf=str(cluster.conf), partition=cluster.partition)
    return SlurmScheduler(run_dir, nodes=2, job_id="", slurm=config, handle_signals=False, alloc_timeout_s=20)


def test_an_own_allocation_is_taken_and_cancelled(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    sched = _scheduler(slurm_cluster, tmp_path / "run")
    job_id = sched.job_id
    assert len(sched.nodes()) == 2
    sched.start_group(WorkerGroupSpec(name="one", command=[sys.executable, str(WORKER), "sleep"], placement=[1]))
    sched.stop_all(grace_s=2.0)
    state = _slurm(slurm_cluster, "squeue", "-h", "--states=all", "-j", job_id, "-o", "%T").stdout.strip()
    assert state in ("CANCELLED", "COMPLETED", "COMPLETING"), state


@pytest.mark.kills_nodes
def test_a_lost_node_fails_its_worker_naming_the_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Kills node 1 (its slurmd and the worker's task), then restarts both."""
    sched = _scheduler(slurm_cluster, tmp_path / "run")
    marker = str(tmp_path / "ready-{rank}")
    try:
        sched.start_group(
            WorkerGroupSpec(
                name="victim",
                command=[sys.executable, str(WORKER), "touch", marker],
                replicas=2,
                placement=[0, 1],
                readiness=ReadinessCheck.file(marker),
            )
        )
        sched.wait_ready("victim", timeout_s=WAIT_S)
        lost = sched.nodes()[1]
        slurm_cluster.nodes[1].kill()
        deadline = time.monotonic() + 120.0
        while sched.status("victim")[1].status is not WorkerStatus.FAILED:
            assert time.monotonic() < deadline, sched.status("victim")
            time.sleep(0.2)
        with pytest.raises(WorkerFailedError) as excinfo:
            sched.check("victim")
        assert lost.label in str(excinfo.value)
    finally:
        try:
            sched.stop_all(grace_s=1.0)
        finally:
            slurm_cluster.restart_node(1)
