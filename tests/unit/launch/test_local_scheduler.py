"""LocalScheduler specifics: log files, process-group stop, exit hooks, device pool, spawn errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import OWN_DEVICES_ENV, ReadinessCheck, WorkerGroupSpec, WorkerStatus, local_device_index
from areal_tasks.errors import ConfigError, SchedulerError
from areal_tasks.launch import LocalScheduler
from areal_tasks.launch.process import pid_alive

WAIT_S = 30.0
REPO = Path(__file__).resolve().parents[3]

Cmd = Callable[..., list[str]]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalScheduler]:
    sched = LocalScheduler(run_dir=tmp_path / "run", devices=["0", "1"], handle_signals=False)
    try:
        yield sched
    finally:
        sched.stop_all(grace_s=2.0)


def test_log_file_per_worker_holds_stdout_and_stderr(local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    infos = local.start_group(
        WorkerGroupSpec(name="logger", command=worker_cmd("dump", str(tmp_path / "o{rank}")), replicas=2)
    )
    local.wait("logger", timeout_s=WAIT_S)
    for info in infos:
        assert info.log_path == str(tmp_path / "run" / "logs" / "logger" / f"{info.rank}.log")
        text = Path(info.log_path).read_text()
        assert "hello stdout" in text and "hello stderr" in text


def test_stop_kills_grandchildren_that_ignore_sigterm(local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    ready, pidfile = tmp_path / "ready", tmp_path / "grandchild.pid"
    [info] = local.start_group(
        WorkerGroupSpec(
            name="parent",
            command=worker_cmd("stubborn-child", str(ready), str(pidfile)),
            readiness=ReadinessCheck.file(str(ready)),
        )
    )
    local.wait_ready("parent", timeout_s=WAIT_S)
    grandchild = int(pidfile.read_text())
    assert info.pid is not None and pid_alive(info.pid) and pid_alive(grandchild)

    local.stop_group("parent", grace_s=0.3)
    assert not pid_alive(info.pid)
    assert not pid_alive(grandchild)
    assert local.status("parent")[0].status is WorkerStatus.STOPPED


def _controller_script(run_dir: Path, pidfile: Path, then: str) -> str:
    return textwrap.dedent(
        f"""
        import sys, time
        from areal_tasks.api.scheduler import WorkerGroupSpec
        from areal_tasks.launch import LocalScheduler
        sched = LocalScheduler(run_dir={str(run_dir)!r}, devices=[])
        [info] = sched.start_group(
            WorkerGroupSpec(name="w", command=[sys.executable, "-c", "import time; time.sleep(600)"])
        )
        with open({str(pidfile)!r} + ".tmp", "w") as f:
            f.write(str(info.pid))
        import os; os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
        {then}
        """
    )


def _run_controller(tmp_path: Path, then: str) -> subprocess.Popen[bytes]:
    script = _controller_script(tmp_path / "run", tmp_path / "worker.pid", then)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO)


def _read_pid_when_written(path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert proc.poll() is None, f"controller exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "controller never started its worker"
        time.sleep(0.02)
    return int(path.read_text())


def test_workers_stop_when_the_controller_exits_normally(tmp_path: Path) -> None:
    controller = _run_controller(tmp_path, then="pass  # return normally: atexit must stop the worker")
    assert controller.wait(timeout=WAIT_S) == 0
    worker_pid = int((tmp_path / "worker.pid").read_text())
    assert not pid_alive(worker_pid)


def test_workers_stop_when_the_controller_gets_sigterm(tmp_path: Path) -> None:
    controller = _run_controller(tmp_path, then="time.sleep(600)")
    try:
        worker_pid = _read_pid_when_written(tmp_path / "worker.pid", controller)
        assert pid_alive(worker_pid)
        controller.send_signal(signal.SIGTERM)
        assert controller.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
        assert not pid_alive(worker_pid)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()


def test_devices_are_handed_out_from_the_pool(local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    spec = WorkerGroupSpec(
        name="gpu", command=worker_cmd("dump", str(tmp_path / "d{rank}")), replicas=2, devices_per_worker=1
    )
    infos = local.start_group(spec)
    assert [i.devices for i in infos] == [["0"], ["1"]]
    local.wait("gpu", timeout_s=WAIT_S)
    envs = [json.loads((tmp_path / f"d{r}").read_text())["env"] for r in range(2)]
    # its own device first (cuda:0), the other after it: visible to NCCL's peer-to-peer path only
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "1,0"]
    assert [e[OWN_DEVICES_ENV] for e in envs] == ["1", "1"]

    more = WorkerGroupSpec(name="gpu2", command=worker_cmd("sleep"), devices_per_worker=1)
    with pytest.raises(SchedulerError, match=r"gpu2/0 needs 1 device\(s\) but only 0 of 2"):
        local.start_group(more)
    local.stop_group("gpu")  # releases the devices
    assert local.start_group(more)[0].devices == ["0"]


def test_a_colocated_group_shares_the_devices_another_group_holds(
    local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path
) -> None:
    holder = local.start_group(
        WorkerGroupSpec(name="servers", command=worker_cmd("sleep"), replicas=2, devices_per_worker=1)
    )
    held = [i.devices for i in holder]
    assert held == [["0"], ["1"]]
    sharer = WorkerGroupSpec(
        name="trainers",
        command=worker_cmd("dump", str(tmp_path / "t{rank}")),
        replicas=2,
        devices_per_worker=1,
        shared_devices=held,
    )
    infos = local.start_group(sharer)
    assert [i.devices for i in infos] == held
    local.wait("trainers", timeout_s=WAIT_S)
    envs = [json.loads((tmp_path / f"t{r}").read_text())["env"] for r in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "1,0"]  # each on its server's GPU
    local.stop_group("trainers")  # gives nothing back: the servers still hold both
    with pytest.raises(SchedulerError, match="only 0 of 2"):
        local.start_group(WorkerGroupSpec(name="more", command=worker_cmd("sleep"), devices_per_worker=1))
    local.stop_group("servers")
    with pytest.raises(SchedulerError, match="0 are held by no worker; start the group that holds them first"):
        local.start_group(sharer)
    with pytest.raises(SchedulerError, match="7 are not in the pool"):
        local.start_group(
            WorkerGroupSpec(name="stray", command=worker_cmd("sleep"), devices_per_worker=1, shared_devices=[["7"]])
        )
    assert local.start_group(
        WorkerGroupSpec(name="again", command=worker_cmd("sleep"), replicas=2, devices_per_worker=1)
    )[1].devices == ["1"]


def test_shared_devices_must_fit_the_group() -> None:
    with pytest.raises(ConfigError, match="one list of devices_per_worker=1 ids per replica"):
        WorkerGroupSpec(name="g", command=["x"], replicas=2, devices_per_worker=1, shared_devices=[["0"]])


def test_a_worker_computes_on_its_first_own_device_else_on_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(OWN_DEVICES_ENV, "1")
    assert local_device_index() == 0  # a scheduler listed this worker's own device first
    monkeypatch.delenv(OWN_DEVICES_ENV)
    assert local_device_index() == 1  # torchrun: every rank sees every device


def test_hide_devices_sets_an_empty_cuda_visible_devices(
    local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path
) -> None:
    out = tmp_path / "env.json"
    shown = WorkerGroupSpec(name="shown", command=worker_cmd("dump", str(out)), env={"CUDA_VISIBLE_DEVICES": "7"})
    local.start_group(shown)
    local.wait("shown", timeout_s=WAIT_S)
    assert json.loads(out.read_text())["env"]["CUDA_VISIBLE_DEVICES"] == "7"  # untouched unless asked

    hidden = WorkerGroupSpec(name="hidden", command=worker_cmd("dump", str(out)), hide_devices=True)
    local.start_group(hidden)
    local.wait("hidden", timeout_s=WAIT_S)
    assert json.loads(out.read_text())["env"]["CUDA_VISIBLE_DEVICES"] == ""


def test_missing_executable_raises_scheduler_error_and_releases_ports(local: LocalScheduler, tmp_path: Path) -> None:
    spec = WorkerGroupSpec(name="nope", command=[str(tmp_path / "no-such-binary")], replicas=2)
    with pytest.raises(SchedulerError, match=r"could not start worker nope/0.*no-such-binary"):
        local.start_group(spec)
    assert local._ports.held == frozenset()
    with pytest.raises(SchedulerError, match="unknown worker group"):
        local.status("nope")


def test_stale_readiness_file_is_removed_before_start(local: LocalScheduler, worker_cmd: Cmd, tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    marker.write_text("left over from an earlier run")
    local.start_group(
        WorkerGroupSpec(name="stale", command=worker_cmd("sleep"), readiness=ReadinessCheck.file(str(marker)))
    )
    assert not marker.exists()
    assert local.status("stale")[0].status is WorkerStatus.STARTING


def test_torch_distributed_env_counts_local_ranks_per_node() -> None:
    from areal_tasks.api.scheduler import torch_distributed_env

    spec = WorkerGroupSpec(name="t", command=["x"], replicas=4, placement=[1, 1, 0, 0], torch_distributed=True)
    envs = [torch_distributed_env(spec, rank, "10.0.0.2", 29500) for rank in range(4)]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]  # node order: as ranks first appear
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"} and {e["MASTER_ADDR"] for e in envs} == {"10.0.0.2"}


@pytest.mark.parametrize("placement", [[0], [0, 1, 2], [0, -1], [0, True]])
def test_a_placement_must_name_one_node_per_rank(placement: list[int]) -> None:
    with pytest.raises(ConfigError, match="placement="):
        WorkerGroupSpec(name="t", command=["x"], replicas=2, placement=placement)
