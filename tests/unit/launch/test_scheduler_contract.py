"""The Scheduler contract, run against every backend the ``scheduler`` fixture provides.

Each test drives the public API only (start_group, wait_ready, status, check, wait, stop_group,
stop_all, context manager), so a new backend passes these before it is used anywhere.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import ReadinessCheck, Scheduler, WorkerGroupSpec, WorkerStatus
from areal_tasks.errors import ReadinessTimeoutError, SchedulerError, WorkerFailedError
from areal_tasks.launch.process import pid_alive

WAIT_S = 30.0  # upper bound only: a healthy run is ready in well under a second

Cmd = Callable[..., list[str]]


def _get(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return int(response.status)


def test_two_http_replicas_become_ready(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    spec = WorkerGroupSpec(
        name="server",
        command=worker_cmd("http", "{port}"),
        replicas=2,
        readiness=ReadinessCheck.http("http://{host}:{port}/health"),
        ready_timeout_s=WAIT_S,
    )
    infos = scheduler.start_group(spec)
    assert [i.status for i in infos] == [WorkerStatus.STARTING] * 2
    scheduler.wait_ready("server")

    workers = scheduler.status("server")
    assert [w.rank for w in workers] == [0, 1]
    assert all(w.status is WorkerStatus.RUNNING for w in workers)
    assert workers[0].ports[0] != workers[1].ports[0]
    for worker in workers:
        assert _get(f"http://{worker.host}:{worker.ports[0]}/health") == 200
    scheduler.check("server")


def test_file_readiness(scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    marker = str(tmp_path / "ready-{rank}")
    spec = WorkerGroupSpec(
        name="filer", command=worker_cmd("touch", marker), replicas=2, readiness=ReadinessCheck.file(marker)
    )
    scheduler.start_group(spec)
    scheduler.wait_ready("filer", timeout_s=WAIT_S)
    assert (tmp_path / "ready-0").exists() and (tmp_path / "ready-1").exists()
    assert {w.status for w in scheduler.status("filer")} == {WorkerStatus.RUNNING}


def test_readiness_timeout_names_worker_and_log(scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    spec = WorkerGroupSpec(
        name="slow", command=worker_cmd("sleep"), readiness=ReadinessCheck.file(str(tmp_path / "never"))
    )
    infos = scheduler.start_group(spec)
    with pytest.raises(ReadinessTimeoutError) as excinfo:
        scheduler.wait_ready("slow", timeout_s=0.3)
    message = str(excinfo.value)
    assert "slow/0" in message and infos[0].log_path in message and "does not exist yet" in message
    assert "ready_timeout_s" in message


def test_crash_during_startup_reports_exit_code_and_log_tail(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    spec = WorkerGroupSpec(
        name="crashy",
        command=worker_cmd("crash", "3", "cannot load model weights"),
        readiness=ReadinessCheck.http(),
        ready_timeout_s=WAIT_S,
    )
    infos = scheduler.start_group(spec)
    with pytest.raises(WorkerFailedError) as excinfo:
        scheduler.wait_ready("crashy")
    message = str(excinfo.value)
    assert "crashy/0" in message and "exit code 3" in message
    assert "cannot load model weights" in message and infos[0].log_path in message
    [worker] = scheduler.status("crashy")
    assert worker.status is WorkerStatus.FAILED and worker.exit_code == 3


def test_crash_after_ready_is_seen_by_status_and_check(scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    ready, trigger = tmp_path / "ready", tmp_path / "trigger"
    spec = WorkerGroupSpec(
        name="flaky",
        command=worker_cmd("ready-then-crash", str(ready), str(trigger), "7"),
        readiness=ReadinessCheck.file(str(ready)),
    )
    scheduler.start_group(spec)
    scheduler.wait_ready("flaky", timeout_s=WAIT_S)
    scheduler.check("flaky")  # healthy: does not raise
    assert scheduler.status("flaky")[0].status is WorkerStatus.RUNNING

    trigger.touch()
    [final] = scheduler.wait("flaky", timeout_s=WAIT_S)
    assert final.status is WorkerStatus.FAILED and final.exit_code == 7
    assert scheduler.status("flaky")[0].status is WorkerStatus.FAILED
    with pytest.raises(WorkerFailedError, match=r"(?s)flaky/0.*exit code 7.*trigger seen, crashing"):
        scheduler.check("flaky")


def test_torch_distributed_env_is_consistent_across_ranks(
    scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path
) -> None:
    spec = WorkerGroupSpec(
        name="trainer",
        command=worker_cmd("dump", str(tmp_path / "env-{rank}.json")),
        replicas=3,
        ports_per_worker=0,
        torch_distributed=True,
    )
    scheduler.start_group(spec)
    finals = scheduler.wait("trainer", timeout_s=WAIT_S)
    assert [w.status for w in finals] == [WorkerStatus.SUCCEEDED] * 3
    envs = [json.loads((tmp_path / f"env-{rank}.json").read_text())["env"] for rank in range(3)]
    assert len({e["MASTER_ADDR"] for e in envs}) == 1
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"3"}


def test_placeholders_are_expanded_in_command_env_and_cwd(
    scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path
) -> None:
    spec = WorkerGroupSpec(
        name="probe",
        command=worker_cmd(
            "dump",
            str(tmp_path / "out-{rank}.json"),
            "{rank}/{world_size}",
            "{host}:{port}",
            "{port_1}",
            "{run_dir}",
            "{group}",
            "{'literal': 1}",
        ),
        env={"MY_PORT": "{port}"},
        cwd=str(tmp_path),
        replicas=2,
        ports_per_worker=2,
    )
    infos = scheduler.start_group(spec)
    scheduler.wait("probe", timeout_s=WAIT_S)
    for info in infos:
        dumped = json.loads((tmp_path / f"out-{info.rank}.json").read_text())
        argv = dumped["argv"]
        assert argv[0] == f"{info.rank}/2"
        assert argv[1] == f"{info.host}:{info.ports[0]}" and argv[2] == str(info.ports[1])
        assert Path(argv[3]).is_dir() and argv[4] == "probe" and argv[5] == "{'literal': 1}"
        assert dumped["env"]["MY_PORT"] == str(info.ports[0])
        assert dumped["cwd"] == str(tmp_path)
    assert len({p for info in infos for p in info.ports}) == 4


def test_starting_a_running_group_name_again_raises(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    spec = WorkerGroupSpec(name="dup", command=worker_cmd("sleep"))
    scheduler.start_group(spec)
    with pytest.raises(SchedulerError, match="already running"):
        scheduler.start_group(spec)
    scheduler.stop_group("dup", grace_s=2.0)
    assert [w.status for w in scheduler.status("dup")] == [WorkerStatus.STOPPED]
    scheduler.start_group(spec)  # a stopped name may be reused
    assert scheduler.status("dup")[0].status is WorkerStatus.RUNNING


def test_unknown_group_raises(scheduler: Scheduler) -> None:
    with pytest.raises(SchedulerError, match="unknown worker group 'ghost'"):
        scheduler.status("ghost")


def test_wait_times_out_on_a_running_worker(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    scheduler.start_group(WorkerGroupSpec(name="forever", command=worker_cmd("sleep")))
    with pytest.raises(SchedulerError, match=r"forever/0 .*still run"):
        scheduler.wait("forever", timeout_s=0.2)


def test_context_manager_stops_every_group(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    with scheduler as sched:
        a = sched.start_group(WorkerGroupSpec(name="a", command=worker_cmd("sleep"), replicas=2))
        b = sched.start_group(WorkerGroupSpec(name="b", command=worker_cmd("sleep")))
        pids = [w.pid for w in a + b]
        assert all(pid is not None and pid_alive(pid) for pid in pids)
    assert not any(pid_alive(pid) for pid in pids if pid is not None)
    assert {w.status for g in ("a", "b") for w in scheduler.status(g)} == {WorkerStatus.STOPPED}


def test_nodes_are_numbered_in_placement_order(scheduler: Scheduler) -> None:
    nodes = scheduler.nodes()
    assert nodes and [n.index for n in nodes] == list(range(len(nodes)))
    assert all(n.address and n.name and n.cpus > 0 and n.gpus >= 0 for n in nodes)


def test_ranks_run_on_their_placement_with_per_node_local_ranks(
    scheduler: Scheduler, worker_cmd: Cmd, tmp_path: Path
) -> None:
    """Ranks spread over every node the scheduler has (one node locally): each sees its node's
    address, and LOCAL_RANK / NODE_RANK are counted per node."""
    nodes = scheduler.nodes()
    placement = [rank * len(nodes) // 4 for rank in range(4)]
    spec = WorkerGroupSpec(
        name="placed",
        command=worker_cmd("dump", str(tmp_path / "placed-{rank}.json"), "{node}", "{host}"),
        replicas=4,
        ports_per_worker=0,
        torch_distributed=True,
        placement=placement,
        cpus_per_worker=0.1,
    )
    infos = scheduler.start_group(spec)
    finals = scheduler.wait("placed", timeout_s=WAIT_S)
    assert [w.status for w in finals] == [WorkerStatus.SUCCEEDED] * 4
    assert [info.node for info in infos] == placement
    dumps = [json.loads((tmp_path / f"placed-{rank}.json").read_text()) for rank in range(4)]
    for rank, (info, dumped) in enumerate(zip(infos, dumps)):
        env = dumped["env"]
        node = nodes[placement[rank]]
        assert dumped["argv"] == [str(node.index), node.address] and info.host == node.address
        assert env["AREAL_NODE_ADDR"] == node.address
        assert env["MASTER_ADDR"] == nodes[placement[0]].address
        assert env["NODE_RANK"] == str(sorted(set(placement)).index(placement[rank]))
        assert env["LOCAL_RANK"] == str(placement[:rank].count(placement[rank]))
        assert env["LOCAL_WORLD_SIZE"] == str(placement.count(placement[rank]))


def test_a_placement_beyond_the_nodes_is_refused(scheduler: Scheduler, worker_cmd: Cmd) -> None:
    missing = len(scheduler.nodes())
    spec = WorkerGroupSpec(name="nowhere", command=worker_cmd("sleep"), placement=[missing])
    with pytest.raises(SchedulerError, match=rf"nodes? \[?{missing}"):
        scheduler.start_group(spec)
