"""``areal serve --http-frontend process`` as a pair of processes: how it starts, reports and stops.

The session server of this directory runs in this mode (``conftest.py``), so every HTTP test here
goes through the bridge; these tests cover what only the pair has: the front end is a child of
the served PID, SIGTERM to that PID stops both, a front end that dies stops the engine process,
and a taken port fails the start with an exit code and a message that says so.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from embedded_server import free_port, running_process


def children(pid: int) -> list[int]:
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(child) for child in path.read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {limit_s} s")
        time.sleep(0.1)


def test_sigterm_stops_both_and_a_dead_front_end_stops_the_engine(tiny_qwen2: Path, tmp_path: Path) -> None:
    args = ("--http-frontend", "process", "--shutdown-timeout-s", "9", "--switch-interval-us", "100")
    with running_process(tiny_qwen2, tmp_path / "a.log", *args) as (url, proc):
        info = httpx.get(f"{url}/server_info", timeout=30).json()
        assert info["http_frontend"] == "process" and info["switch_interval_us"] == 100.0
        [front_end] = children(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
        wait_until(lambda: not alive(front_end), 10, "the front end's exit after SIGTERM to the server")
        [engine_socket] = re.findall(r"unix socket (\S+)/engine\.sock", (tmp_path / "a.log").read_text())
        assert not Path(engine_socket).exists()  # the private directory went with the server

    with running_process(tiny_qwen2, tmp_path / "b.log", *args) as (url, proc):
        [front_end] = children(proc.pid)
        os.kill(front_end, signal.SIGKILL)
        assert proc.wait(timeout=15) == 0  # its own bounded stop, not a signal
        log = (tmp_path / "b.log").read_text()
        assert "the HTTP front end is gone (exit -9): stopping the server" in log


def test_a_ctrl_c_to_the_process_group_stops_both_quietly(tiny_qwen2: Path, tmp_path: Path) -> None:
    """Both processes get SIGINT; the front end usually ends first, which is no error."""
    with running_process(tiny_qwen2, tmp_path / "c.log", "--http-frontend", "process") as (url, proc):
        httpx.get(f"{url}/server_info", timeout=30).raise_for_status()  # past the start-up
        [front_end] = children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        wait_until(lambda: not alive(front_end), 10, "the front end's exit after a Ctrl-C")
    log = (tmp_path / "c.log").read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]


def test_a_taken_port_fails_the_start_with_a_message(tiny_qwen2: Path, tmp_path: Path) -> None:
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        argv = [sys.executable, "-m", "areal_tasks.cli", "serve", "--model", str(tiny_qwen2), "--device", "cpu"]
        argv += ["--port", str(port), "--http-frontend", "process", "--num-threads", "1"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "exited with" in done.stderr and "before it served" in done.stderr
    assert "address already in use" in done.stderr


@pytest.mark.parametrize("value", ["threads", ""])
def test_an_unknown_front_end_mode_is_refused_by_the_parser(value: str) -> None:
    argv = [sys.executable, "-m", "areal_tasks.cli", "serve", "--model", "/nonexistent", "--http-frontend", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--http-frontend" in done.stderr
