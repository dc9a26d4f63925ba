"""The reaper a Ray supervisor leaves behind, without Ray: when the watched pid (the supervisor actor)
dies, every process carrying the worker's marker dies too, a ``setsid`` grandchild included; while
the watched pid lives the worker is left alone, and the reaper exits by itself once the tree is empty."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from areal_tasks.launch.process import kill_tree, new_marker, pid_alive, tree_pids, with_marker
from areal_tasks.launch.ray.reaper import spawn_reaper

WORKER = Path(__file__).with_name("worker.py")


def _wait(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _reapers(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = (Path("/proc") / entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"areal_tasks.launch.ray.reaper" in cmdline and marker.encode() in cmdline:
                out.append(int(entry))
    return [p for p in out if pid_alive(p)]


def test_the_reaper_kills_the_worker_tree_when_the_watched_pid_dies(tmp_path: Path) -> None:
    actor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stands in for the actor
    marker = new_marker("worker")
    ready, pidfile, log = tmp_path / "ready", tmp_path / "child.pid", tmp_path / "worker.log"
    env = with_marker(dict(os.environ), marker)
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "escaped-child", str(ready), str(pidfile)], env=env, start_new_session=True
    )
    try:
        assert _wait(ready.exists), "the worker did not start its escaped child"
        child = int(pidfile.read_text())
        spawn_reaper(actor.pid, marker, os.environ, str(log))
        assert _wait(lambda: bool(_reapers(marker)), 10), "no reaper running"
        time.sleep(1.0)  # the actor lives: the worker is left alone
        assert pid_alive(worker.pid) and pid_alive(child)
        actor.kill()
        actor.wait()
        assert _wait(lambda: not pid_alive(child) and worker.poll() is not None), "the tree survived its actor"
        assert _wait(lambda: not _reapers(marker), 10), "the reaper did not exit"
        assert "supervisor actor" in log.read_text()
    finally:
        actor.kill()
        kill_tree(None, marker)
        worker.wait(timeout=10)
        assert not tree_pids(None, marker)


def test_the_reaper_exits_once_the_tree_is_gone(tmp_path: Path) -> None:
    actor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    marker = new_marker("worker")
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=with_marker(dict(os.environ), marker)
    )
    try:
        spawn_reaper(actor.pid, marker, os.environ, str(tmp_path / "log"))
        assert _wait(lambda: bool(_reapers(marker)), 10)
        worker.kill()
        worker.wait()
        assert _wait(lambda: not _reapers(marker), 10), "the reaper outlived the tree it watched"
        assert actor.poll() is None  # and it never touched the actor
    finally:
        actor.kill()
        actor.wait()
        worker.kill()
        worker.wait()
