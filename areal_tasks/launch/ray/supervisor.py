"""The supervisor: one Ray actor per worker, which starts, watches and stops its process on its node.

``RayScheduler`` wraps :class:`Supervisor` with ``ray.remote`` and pins each instance to a bundle
of the job's placement group (a node). Everything node-local happens here: picking free ports on
the node's address, creating the worker's log (on the node; the run directory is shared storage),
starting the worker in its own session with a process marker, checking a readiness file, reading
the log tail, and stopping the worker with :func:`~areal_tasks.launch.process.stop_processes`.

The worker's environment arrives as a method argument (never as a Ray ``runtime_env``, whose
variables the dashboard shows to anyone). Next to every worker the supervisor starts a
:mod:`~areal_tasks.launch.ray.reaper`, which kills the worker's tree if this actor dies.

This module imports no ``ray`` at import time (only :meth:`Supervisor.node` asks Ray for the node's
address), so it is unit-testable as a plain class.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from areal_tasks.errors import SchedulerError
from areal_tasks.launch.process import WorkerProcess, kill_tree, read_log_tail, stop_processes
from areal_tasks.launch.ray.reaper import spawn_reaper

logger = logging.getLogger(__name__)

__all__ = ["Supervisor", "free_ports"]


def free_ports(count: int, host: str, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct ports free on ``host`` now, none of them in ``exclude``."""
    ports: list[int] = []
    for _ in range(200 + 10 * count):
        if len(ports) == count:
            return ports
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in exclude and port not in ports:
            ports.append(port)
    if len(ports) == count:
        return ports
    raise SchedulerError(f"could not find {count} free ports on {host} (got {ports}); is the node out of ports?")


class Supervisor:
    """Starts one worker process on this node and answers for it (wrapped by ``ray.remote``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._process: WorkerProcess | None = None

    def node(self) -> dict[str, Any]:
        """This actor's pid, node address and host name, and the devices Ray gave it."""
        import ray  # only inside a Ray worker process

        return {
            "pid": os.getpid(),
            "address": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def free_ports(self, count: int, host: str, exclude: list[int]) -> list[int]:
        """Free ports on this node's ``host`` address, none in ``exclude`` (held by other workers here)."""
        return free_ports(count, host, set(exclude))

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        log_path: str,
        ready_file: str | None = None,
        devices: int = 0,
        hide_devices: bool = False,
    ) -> int:
        """Start the worker (log truncated, stale ``ready_file`` removed) and its reaper; return its pid.

        ``env`` overlays this actor's environment. ``devices > 0``: the worker gets the devices Ray
        gave this actor (``CUDA_VISIBLE_DEVICES`` as Ray set it) and ``AREAL_OWN_DEVICES``.
        """
        if self._process is not None:
            raise SchedulerError(f"supervisor of {self.name} already started a worker (pid {self._process.pid})")
        full = dict(os.environ)
        full.update(env)
        full.setdefault("PYTHONUNBUFFERED", "1")
        if devices > 0:
            full["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            full["AREAL_OWN_DEVICES"] = str(devices)
        elif hide_devices:
            full["CUDA_VISIBLE_DEVICES"] = ""
            full.pop("AREAL_OWN_DEVICES", None)
        if ready_file and os.path.exists(ready_file):
            logger.info("removing stale readiness file %s before starting %s", ready_file, self.name)
            os.remove(ready_file)
        log = Path(log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        self._process = WorkerProcess.spawn(self.name, argv, full, cwd, log)
        assert self._process.marker is not None
        spawn_reaper(os.getpid(), self._process.marker, dict(os.environ), log_path)
        return self._process.pid

    def poll(self) -> int | None:
        """The worker's exit code, or None while it runs."""
        return None if self._process is None else self._process.poll()

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists on this node (file readiness is node-local)."""
        return os.path.exists(path)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the worker's log, read on this node."""
        return "" if self._process is None else read_log_tail(self._process.log_path, lines)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the worker's tree, SIGKILL it after ``grace_s``; return the worker's exit code."""
        if self._process is None:
            return None
        stop_processes([self._process], grace_s)
        kill_tree(None, self._process.marker)
        return self._process.poll()
