"""Tree kill: processes that leave their worker's process group (``setsid``) are still stopped.

``kill_tree`` directly (by parent pid, by marker), then through the two users that stop whole trees:
``LocalScheduler.stop_group`` and ``LocalJobs`` (cancel, and the leftovers of an attempt whose
wrapper was SIGKILLed). Every escaped process here ignores SIGTERM and writes its pid to a file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import ReadinessCheck, WorkerGroupSpec
from areal_tasks.launch import LocalScheduler
from areal_tasks.launch.jobs import LocalJobs
from areal_tasks.launch.process import MARKER_ENV, kill_tree, new_marker, pid_alive, tree_pids, with_marker

WORKER = Path(__file__).with_name("worker.py")
WAIT_S = 20.0

pytestmark = pytest.mark.timeout(90)


def _wait_file(path: Path, proc: subprocess.Popen[bytes] | None = None) -> str:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert proc is None or proc.poll() is None, f"the process exited with {proc.returncode} before {path}"
        assert time.monotonic() < deadline, f"{path} not written within {WAIT_S:g} s"
        time.sleep(0.02)
    return path.read_text()


def _gone_within(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not pid_alive(pid)


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids SIGKILLed at teardown whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _escaping(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """worker.py escaped-child in a session of its own: (the parent, the escaped child's pid)."""
    ready, pidfile = tmp_path / "ready", tmp_path / "escaped.pid"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "escaped-child", str(ready), str(pidfile)], start_new_session=True, env=env
    )
    _wait_file(ready, proc)
    return proc, int(pidfile.read_text())


def test_with_marker_keeps_inherited_markers() -> None:
    env = with_marker(with_marker({"A": "1"}, "job-1"), "worker-2")
    assert env == {"A": "1", MARKER_ENV: "job-1 worker-2"}


def test_kill_tree_by_pid_reaches_a_setsid_child(tmp_path: Path, leftovers: list[int]) -> None:
    proc, escaped = _escaping(tmp_path)
    leftovers += [proc.pid, escaped]
    assert escaped in tree_pids(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # what a plain group kill reaches: the parent only
    proc.wait()
    assert pid_alive(escaped)
    assert tree_pids(proc.pid) == set()  # the parent is reaped: its pid says nothing any more


def test_kill_tree_by_pid_kills_the_whole_tree(tmp_path: Path, leftovers: list[int]) -> None:
    proc, escaped = _escaping(tmp_path)
    leftovers += [proc.pid, escaped]
    assert kill_tree(proc.pid) == []
    proc.wait()
    assert _gone_within(escaped)


def test_kill_tree_by_marker_finds_orphans(tmp_path: Path, leftovers: list[int]) -> None:
    marker = new_marker("test")
    proc, escaped = _escaping(tmp_path, env=with_marker(os.environ, marker))
    leftovers += [proc.pid, escaped]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()  # the escaped child is now an orphan of another session
    assert tree_pids(None, marker) == {escaped}
    assert kill_tree(None, marker, grace_s=0.2) == []
    assert _gone_within(escaped)


def test_kill_tree_never_targets_the_caller() -> None:
    marker = new_marker("self")
    os.environ[MARKER_ENV] = marker
    try:
        assert os.getpid() not in tree_pids(os.getpid(), marker)
    finally:
        del os.environ[MARKER_ENV]


def test_scheduler_stop_kills_a_worker_child_that_left_the_group(tmp_path: Path, leftovers: list[int]) -> None:
    ready, pidfile = tmp_path / "ready", tmp_path / "escaped.pid"
    sched = LocalScheduler(run_dir=tmp_path / "run", devices=[], handle_signals=False)
    try:
        sched.start_group(
            WorkerGroupSpec(
                name="w",
                command=[sys.executable, str(WORKER), "escaped-child", str(ready), str(pidfile)],
                readiness=ReadinessCheck.file(str(ready)),
            )
        )
        sched.wait_ready("w", timeout_s=WAIT_S)
        escaped = int(pidfile.read_text())
        leftovers.append(escaped)
        sched.stop_group("w", grace_s=0.5)
        assert _gone_within(escaped), f"escaped child {escaped} of the worker outlived stop_group"
    finally:
        sched.stop_all(grace_s=1.0)


def test_job_cancel_kills_a_process_that_left_the_job_group(tmp_path: Path, leftovers: list[int]) -> None:
    jobs = LocalJobs(tmp_path / "jobs")
    ready, pidfile = tmp_path / "ready", tmp_path / "escaped.pid"
    jobs.submit("esc", [sys.executable, str(WORKER), "escaped-child", str(ready), str(pidfile)])
    _wait_file(ready)
    escaped = int(pidfile.read_text())
    leftovers.append(escaped)
    assert jobs.cancel("esc", grace_s=1.0).state == "cancelled"
    assert _gone_within(escaped), f"escaped process {escaped} outlived the cancelled job"


def test_resubmit_stops_what_a_killed_job_left_outside_its_group(tmp_path: Path, leftovers: list[int]) -> None:
    jobs = LocalJobs(tmp_path / "jobs")
    ready, pidfile = tmp_path / "ready", tmp_path / "escaped.pid"
    first = jobs.submit("esc", [sys.executable, str(WORKER), "escaped-child", str(ready), str(pidfile)])
    _wait_file(ready)
    escaped = int(pidfile.read_text())
    leftovers.append(escaped)
    assert first.pid is not None
    os.killpg(first.pid, signal.SIGKILL)  # the wrapper and the job die; the escaped child does not
    deadline = time.monotonic() + WAIT_S
    while jobs.status("esc").state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pid_alive(escaped)
    jobs.submit("esc2", [sys.executable, "-c", "pass"])  # another name: leaves "esc" alone
    assert pid_alive(escaped)
    jobs.submit("esc", [sys.executable, "-c", "pass"])
    assert _gone_within(escaped), f"leftover {escaped} of the killed attempt survived the resubmission"
