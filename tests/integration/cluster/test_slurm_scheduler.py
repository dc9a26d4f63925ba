"""SlurmScheduler against a real SLURM on two namespace nodes (``slurm_cluster``), from the login host.

The scheduler contract (``tests/unit/launch/test_scheduler_contract.py``) runs here unchanged with a
SlurmScheduler as its ``scheduler`` fixture: its tests are imported into this module, whose fixtures
override the unit ones. They share one 2-node allocation (``salloc --no-shell``) for speed; the own
gloo across the nodes and the stop without orphans are tested below; the scheduler's own allocation
and the loss of a node in ``test_slurm_nodes.py`` (they need the nodes this module's allocation holds).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import WorkerGroupSpec, WorkerStatus
from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.launch.process import pid_alive
from areal_tasks.launch.slurm import SlurmScheduler
from tests.fixtures.slurm_cluster import SlurmCluster
from tests.unit.launch.test_scheduler_contract import (  # noqa: F401  (collected here with the fixtures below)
    test_a_placement_beyond_the_nodes_is_refused,
    test_context_manager_stops_every_group,
    test_crash_after_ready_is_seen_by_status_and_check,
    test_crash_during_startup_reports_exit_code_and_log_tail,
    test_file_readiness,
    test_nodes_are_numbered_in_placement_order,
    test_placeholders_are_expanded_in_command_env_and_cwd,
    test_ranks_run_on_their_placement_with_per_node_local_ranks,
    test_readiness_timeout_names_worker_and_log,
    test_starting_a_running_group_name_again_raises,
    test_torch_distributed_env_is_consistent_across_ranks,
    test_two_http_replicas_become_ready,
    test_unknown_group_raises,
    test_wait_times_out_on_a_running_worker,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

WORKER = Path(__file__).parents[2] / "unit" / "launch" / "worker.py"
WAIT_S = 60.0

GLOO = """
import json, os, sys
import torch, torch.distributed as dist
from areal_tasks.launch.netif import pin_socket_interface
pin_socket_interface()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
json.dump({"sum": t.item(), "addr": os.environ["AREAL_NODE_ADDR"], "master": os.environ["MASTER_ADDR"],
           "local_rank": os.environ["LOCAL_RANK"], "node_rank": os.environ["NODE_RANK"]},
          open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def _slurm(cluster: SlurmCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def allocation(slurm_cluster: SlurmCluster) -> Iterator[str]:
    """One 2-node allocation for the contract tests (each test's scheduler uses it, none cancels it)."""
    done = _slurm(slurm_cluster, "salloc", "--no-shell", "--nodes=2", "--exclusive", "--job-name=contract")
    assert done.returncode == 0, done.stderr
    job_id = done.stderr.split()[-1]
    try:
        yield job_id
    finally:
        _slurm(slurm_cluster, "scancel", job_id)


def _config(cluster: SlurmCluster) -> SlurmConfig:
    return SlurmConfig(slurm_conf=str(cluster.conf), partition=cluster.partition)


@pytest.fixture
def scheduler(slurm_cluster: SlurmCluster, allocation: str, tmp_path: Path) -> Iterator[SlurmScheduler]:
    sched = SlurmScheduler(
        tmp_path / "run", job_id=allocation, slurm=_config(slurm_cluster), handle_signals=False, name="contract"
    )
    try:
        yield sched
    finally:
        sched.stop_all(grace_s=2.0)


@pytest.fixture
def worker_cmd() -> Callable[..., list[str]]:
    def build(*args: str) -> list[str]:
        return [sys.executable, str(WORKER), *args]

    return build


def _steps(cluster: SlurmCluster, job_id: str) -> list[str]:
    done = _slurm(cluster, "squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j")
    return [line for line in done.stdout.splitlines() if line.strip() and not line.endswith("|extern")]


def test_the_nodes_are_the_allocations(scheduler: SlurmScheduler, slurm_cluster: SlurmCluster) -> None:
    nodes = scheduler.nodes()
    assert [(n.name, n.address) for n in nodes] == [(n.name, n.address) for n in slurm_cluster.nodes]
    assert all(n.cpus == 2 and n.gpus == 0 for n in nodes)


def test_gloo_all_reduce_across_the_two_nodes(scheduler: SlurmScheduler, tmp_path: Path) -> None:
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    spec = WorkerGroupSpec(
        name="gloo",
        command=[sys.executable, str(script), str(tmp_path / "out-{rank}.json")],
        replicas=2,
        ports_per_worker=0,
        torch_distributed=True,
        placement=[0, 1],
    )
    scheduler.start_group(spec)
    finals = scheduler.wait("gloo", timeout_s=WAIT_S)
    logs = [Path(w.log_path).read_text() for w in finals]
    assert [w.status for w in finals] == [WorkerStatus.SUCCEEDED] * 2, logs
    nodes = scheduler.nodes()
    outs = [json.loads((tmp_path / f"out-{rank}.json").read_text()) for rank in range(2)]
    assert [o["sum"] for o in outs] == [3.0, 3.0]
    assert [o["addr"] for o in outs] == [nodes[0].address, nodes[1].address]
    assert {o["master"] for o in outs} == {nodes[0].address}
    assert [(o["local_rank"], o["node_rank"]) for o in outs] == [("0", "0"), ("0", "1")]


def test_stop_leaves_no_step_and_no_srun_client(
    scheduler: SlurmScheduler, slurm_cluster: SlurmCluster, allocation: str, worker_cmd: Callable[..., list[str]]
) -> None:
    infos = scheduler.start_group(
        WorkerGroupSpec(name="sleepers", command=worker_cmd("sleep"), replicas=2, placement=[0, 1])
    )
    deadline = time.monotonic() + WAIT_S
    while len([s for s in _steps(slurm_cluster, allocation) if "|sleepers-" in s]) < 2:
        assert time.monotonic() < deadline, _steps(slurm_cluster, allocation)
        time.sleep(0.1)
    scheduler.stop_group("sleepers", grace_s=5.0)
    assert [w.status for w in scheduler.status("sleepers")] == [WorkerStatus.STOPPED] * 2
    assert all(w.job_id and w.job_id.startswith(f"{allocation}.") for w in scheduler.status("sleepers"))
    assert not any(pid_alive(i.pid) for i in infos if i.pid is not None)
    assert not [s for s in _steps(slurm_cluster, allocation) if "|sleepers-" in s]
