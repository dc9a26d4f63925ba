"""ServerFleet through a real LocalScheduler with a stand-in server process: start, health,
restart after a crash up to max_restarts, restart of an unhealthy server, crash on start, stop."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import WorkerStatus
from areal_tasks.errors import InferenceServerFailedError
from areal_tasks.inference.launch import ServerCommand, ServerFleet
from areal_tasks.launch import LocalScheduler
from areal_tasks.launch.readiness import probe

SCRIPT = str(Path(__file__).with_name("fake_server_proc.py"))


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[LocalScheduler]:
    sched = LocalScheduler(tmp_path / "run", devices=[], handle_signals=False)
    try:
        yield sched
    finally:
        sched.stop_all(grace_s=2.0)


def fleet(scheduler: LocalScheduler, *extra: str, n: int = 2, max_restarts: int = 2, **kw) -> ServerFleet:
    argv = [sys.executable, SCRIPT, "--host", "{host}", "--port", "{port}", *extra]
    return ServerFleet(
        scheduler, ServerCommand("embedded", argv), n, max_restarts=max_restarts, startup_timeout_s=60, **kw
    )


def healthy(address: str) -> bool:
    return probe("http", f"http://{address}/health").ready


def kill(scheduler: LocalScheduler, group: str) -> None:
    """SIGKILL the server process this test started, and wait until the scheduler has seen it exit."""
    (info,) = scheduler.status(group)
    os.kill(info.pid, signal.SIGKILL)
    for _ in range(2000):
        if scheduler.status(group)[0].status is WorkerStatus.FAILED:
            return
        time.sleep(0.005)
    raise AssertionError(f"{group} did not exit after SIGKILL")


def test_start_check_and_stop(scheduler: LocalScheduler, monkeypatch) -> None:
    monkeypatch.delenv("AREAL_SERVER_ADMIN_KEY", raising=False)
    servers = fleet(scheduler)
    addresses = servers.start()
    assert os.environ["AREAL_SERVER_ADMIN_KEY"]  # the job's server key, made before the first server
    assert len(set(addresses)) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(healthy(a) for a in addresses)
    assert servers.check() == []
    servers.stop()
    assert not any(healthy(a) for a in addresses)
    assert all(i.status is WorkerStatus.STOPPED for g in ("inference-0", "inference-1") for i in scheduler.status(g))


def test_crashed_server_is_restarted_up_to_max_restarts(scheduler: LocalScheduler) -> None:
    with fleet(scheduler, max_restarts=2) as servers:
        before = servers.addresses
        kill(scheduler, "inference-0")
        assert servers.check() == [0]
        after = servers.addresses
        assert after[1] == before[1] and after[0] != before[0] and healthy(after[0])
        kill(scheduler, "inference-0")
        assert servers.check() == [0]
        assert servers.restarts == [2, 0]
        kill(scheduler, "inference-0")
        with pytest.raises(InferenceServerFailedError) as info:
            servers.check()
    message = str(info.value)
    assert "max_restarts=2" in message and "SIGKILL" in message and "fake server on" in message


def test_unhealthy_server_is_restarted(scheduler: LocalScheduler, tmp_path: Path) -> None:
    sick = tmp_path / "sick"
    with fleet(scheduler, "--sick-file", str(sick), n=1, unhealthy_limit=2) as servers:
        address = servers.addresses[0]
        sick.write_text(address.rsplit(":", 1)[1])
        assert servers.check() == []  # one failed probe is tolerated
        assert servers.check() == [0]
        assert servers.addresses[0] != address and healthy(servers.addresses[0])
        assert servers.restarts == [1]


def test_crash_on_start_is_retried_then_reported(scheduler: LocalScheduler) -> None:
    servers = fleet(scheduler, "--exit-code", "3", n=1, max_restarts=1)
    with pytest.raises(InferenceServerFailedError) as info:
        servers.start()
    message = str(info.value)
    assert "exit code 3" in message and "fake server failing on purpose" in message
    assert "max_restarts=1" in message and servers.restarts == [1]
    servers.stop()
