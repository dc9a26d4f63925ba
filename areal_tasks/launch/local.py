"""LocalScheduler: worker groups as subprocesses of the controller on this machine.

Every worker is its own session and process group (see :mod:`.process`), logs stdout+stderr to
``<run_dir>/logs/<group>/<rank>.log`` (overwritten when a group of that name starts again), gets
free loopback ports from one allocator per scheduler (no two workers of a scheduler share a port),
and device ids from the scheduler's pool through ``CUDA_VISIBLE_DEVICES``. All groups are stopped
when the scheduler is used as a context manager and exits, and when the Python process exits
(see :mod:`.cleanup`).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.scheduler import (
    NODE_ADDR_ENV,
    OWN_DEVICES_ENV,
    NodeInfo,
    WorkerGroupSpec,
    WorkerInfo,
    WorkerStatus,
    expand_placeholders,
    torch_distributed_env,
)
from areal_tasks.errors import SchedulerError, WorkerFailedError
from areal_tasks.launch import cleanup
from areal_tasks.launch.base import GroupScheduler
from areal_tasks.launch.devices import DevicePool, detect_devices
from areal_tasks.launch.ports import PortAllocator
from areal_tasks.launch.process import WorkerProcess, stop_processes

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["LocalScheduler"]

LOG_TAIL_LINES = 40


@dataclass
class _Worker:
    info: WorkerInfo
    process: WorkerProcess
    ready_target: str
    stop_requested: bool = False


@dataclass
class _Group:
    spec: WorkerGroupSpec
    workers: list[_Worker] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    released: bool = False


class LocalScheduler(GroupScheduler[_Group, _Worker]):
    """Runs worker groups as local subprocesses.

    Args:
        run_dir: root of the run; logs go under ``<run_dir>/logs``; ``{run_dir}`` expands to it.
        devices: accelerator ids this scheduler may hand out; None detects them (empty on CPU).
        host: the address workers are reached at (``{host}``, ``MASTER_ADDR``); ports are picked on it.
        handle_signals: turn SIGTERM/SIGHUP of the controller into a normal exit that stops workers.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        devices: list[str] | None = None,
        host: str = "127.0.0.1",
        handle_signals: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self._ports = PortAllocator(host)
        self._devices = DevicePool(detect_devices() if devices is None else devices)
        self._groups: dict[str, _Group] = {}
        self._lock = threading.RLock()
        cleanup.register(self, handle_signals=handle_signals)

    @classmethod
    def from_config(cls, cfg: JobConfig) -> LocalScheduler:
        """The scheduler of a job: on its run directory, with the devices this machine has."""
        return cls(cfg.experiment.run_dir or ".")

    @classmethod
    def can_run_controller_here(cls, cfg: JobConfig) -> bool:
        """Always: the local scheduler's workers run on this machine, next to the controller."""
        return True

    @classmethod
    def preflight(cls, cfg: JobConfig) -> dict[str, Any]:
        """This machine's CPUs, GPUs, memory and free ports against ``cfg.allocation``
        (:func:`~areal_tasks.launch.resources.check_local_resources`); SchedulerError listing every
        shortage. ``cluster.gpus_per_node`` is the GPU count asked for (0 = a CPU run) and
        ``cluster.memory_gb_per_node`` the memory that must be available (None = no minimum)."""
        from areal_tasks.errors import AllocationError
        from areal_tasks.launch.resources import check_local_resources

        gpus = int(cfg.cluster.gpus_per_node or 0)
        memory = cfg.cluster.memory_gb_per_node
        try:
            report = check_local_resources(cfg.allocation, gpus, 0.0 if memory is None else float(memory))
        except AllocationError as exc:
            raise SchedulerError(f"allocation {cfg.allocation!r} is not valid: {exc}") from exc
        problems = report.pop("problems")
        for warning in report["warnings"]:
            logger.warning("%s", warning)
        if problems:
            raise SchedulerError("this machine cannot run the job:\n- " + "\n- ".join(problems))
        return {"scheduler": "local", "nodes": 1, **report}

    # -- Scheduler API -------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """This machine, as the one node: its host name, ``host``, its cores and the device pool."""
        return [
            NodeInfo(
                index=0,
                name=socket.gethostname(),
                address=self.host,
                cpus=float(len(os.sched_getaffinity(0))),
                gpus=self._devices.size,
            )
        ]

    def start_group(self, spec: WorkerGroupSpec) -> list[WorkerInfo]:
        have = len(self.nodes())
        elsewhere = sorted({node for node in spec.placement or [] if node >= have})
        if elsewhere:
            raise SchedulerError(f"group {spec.name!r} places ranks on nodes {elsewhere}, but {self._nodes_phrase()}")
        return self._start_named(_Group(spec), self._launch)

    def status(self, group: str) -> list[WorkerInfo]:
        state = self._group(group)
        with self._lock:
            for worker in state.workers:
                self._refresh(worker)
            return [copy.deepcopy(w.info) for w in state.workers]

    def check(self, group: str) -> None:
        state = self._group(group)
        failed = [w for w in state.workers if self._refresh(w) is WorkerStatus.FAILED]
        if failed:
            raise WorkerFailedError("\n\n".join(_failure_message(w, "unexpectedly") for w in failed))

    def wait(self, group: str, timeout_s: float | None = None) -> list[WorkerInfo]:
        state = self._group(group)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for worker in state.workers:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                worker.process.popen.wait(timeout=remaining)
            except subprocess.TimeoutExpired as exc:
                running = [w.info.name for w in state.workers if w.process.poll() is None]
                raise SchedulerError(
                    f"workers {', '.join(running)} of group {group!r} still run after {timeout_s}s; "
                    "raise the timeout, or stop_group() them if they hang (logs under "
                    f"{self.run_dir / 'logs' / group})"
                ) from exc
        return self.status(group)

    def stop_all(self, grace_s: float = 10.0) -> None:
        with self._lock:
            groups = list(self._groups.values())
        self._stop(groups, grace_s)

    # -- what a subclass with several nodes overrides (the namespace-cluster test scheduler) ------

    def _nodes_phrase(self) -> str:
        """Completes "group X places ranks on nodes [..], but ..."."""
        return (
            "the local scheduler has only node 0 (this machine); use cluster.scheduler=ray or slurm for several nodes"
        )

    def _node_address(self, node: int) -> str:
        """Where node ``node``'s workers are reached (``{host}``, ``AREAL_NODE_ADDR``, ``MASTER_ADDR``)."""
        return self.host

    def _node_command(self, node: int, argv: list[str], cwd: str | None) -> list[str]:
        """The command line that runs ``argv`` on node ``node`` (here: as it is)."""
        return argv

    # -- internals -----------------------------------------------------------------------------

    def _announce_ready(self, worker: _Worker, detail: str) -> None:
        logger.info("%s is ready (%s)", worker.info.name, detail)

    def _failure_message(self, worker: _Worker, when: str) -> str:
        return _failure_message(worker, when)

    def _timeout_message(
        self, spec: WorkerGroupSpec, pending: list[_Worker], last_probe: dict[int, str], timeout: float
    ) -> str:
        return _timeout_message(spec, pending, last_probe, timeout)

    def _refresh(self, worker: _Worker) -> WorkerStatus:
        """Poll ``worker``'s process and record its exit; returns the (new) status."""
        with self._lock:
            info = worker.info
            if info.status.is_terminal:
                return info.status
            code = worker.process.poll()
            if code is None:
                return info.status
            info.exit_code = code
            if worker.stop_requested:
                info.status = WorkerStatus.STOPPED
            else:
                info.status = WorkerStatus.SUCCEEDED if code == 0 else WorkerStatus.FAILED
                log = logger.info if code == 0 else logger.error
                log("%s exited with code %s; log %s", info.name, code, info.log_path)
            return info.status

    def _launch(self, group: _Group) -> None:
        """Start the workers of the new ``group``; on a failure, what it started (processes, ports,
        devices) is in ``group`` for the caller to stop."""
        spec = group.spec
        master_port = None
        if spec.torch_distributed:
            master_port = self._ports.allocate(1)[0]
            group.ports.append(master_port)
        plans = []
        for rank in range(spec.replicas):
            ports = self._ports.allocate(spec.ports_per_worker)
            group.ports += ports
            if spec.shared_devices is not None:  # colocated: the holder group keeps (and returns) them
                devices = self._devices.check_held(spec.shared_devices[rank], f"worker {spec.name}/{rank}")
            else:
                devices = self._devices.acquire(spec.devices_per_worker, f"worker {spec.name}/{rank}")
                group.devices += devices
            plans.append(self._plan(spec, rank, ports, devices, master_port))
        if spec.readiness.kind == "file":
            for info, _, _, _, target in plans:
                _remove_stale_marker(target, info.name)
        for info, argv, env, cwd, target in plans:
            command = self._node_command(info.node, argv, cwd)
            process = WorkerProcess.spawn(info.name, command, env, cwd, Path(info.log_path))
            info.pid = process.pid
            info.status = WorkerStatus.RUNNING if spec.readiness.kind == "none" else WorkerStatus.STARTING
            group.workers.append(_Worker(info=info, process=process, ready_target=target))

    def _plan(
        self, spec: WorkerGroupSpec, rank: int, ports: list[int], devices: list[str], master_port: int | None
    ) -> tuple[WorkerInfo, list[str], dict[str, str], str | None, str]:
        node = spec.node_of(rank)
        host = self._node_address(node)
        values: dict[str, object] = {
            "rank": rank,
            "world_size": spec.replicas,
            "host": host,
            "node": node,
            "run_dir": self.run_dir,
            "group": spec.name,
        }
        values.update({f"port_{i}": port for i, port in enumerate(ports)})
        if ports:
            values["port"] = ports[0]
        if master_port is not None:
            values["master_port"] = master_port
        argv = [expand_placeholders(part, values) for part in spec.command]
        cwd = expand_placeholders(spec.cwd, values) if spec.cwd is not None else None
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update({key: expand_placeholders(value, values) for key, value in spec.env.items()})
        env[NODE_ADDR_ENV] = host
        if master_port is not None:
            env.update(torch_distributed_env(spec, rank, self._node_address(spec.node_of(0)), master_port))
        if spec.devices_per_worker > 0:  # own first, then the others (for NCCL's peer-to-peer path)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._devices.visible_to(devices))
            env[OWN_DEVICES_ENV] = str(len(devices))
        elif spec.hide_devices:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.pop(OWN_DEVICES_ENV, None)
        target = expand_placeholders(spec.readiness.target, values)
        if spec.readiness.kind == "file":
            target = os.path.join(cwd or os.getcwd(), target)
        log_path = RunPaths.of(self.run_dir).worker_log(spec.name, rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
        info = WorkerInfo(
            group=spec.name, rank=rank, host=host, ports=ports, log_path=str(log_path), devices=devices, node=node
        )
        return info, argv, env, cwd, target

    def _stop(self, groups: list[_Group], grace_s: float) -> None:
        with self._lock:
            for group in groups:
                for worker in group.workers:
                    if not self._refresh(worker).is_terminal:
                        worker.stop_requested = True
        try:
            stop_processes([w.process for g in groups for w in g.workers], grace_s)
        finally:
            with self._lock:
                for group in groups:
                    for worker in group.workers:
                        self._refresh(worker)
                    if not group.released:
                        self._ports.release(group.ports)
                        self._devices.release(group.devices)
                        group.released = True


def _remove_stale_marker(path: str, worker: str) -> None:
    if os.path.exists(path):
        logger.info("removing stale readiness file %s before starting %s", path, worker)
        os.remove(path)


def _describe_exit(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exited with exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:  # a real-time or platform-specific signal without a name
        name = f"signal {-code}"
    return f"was killed by {name} (exit code {code})"


def _failure_message(worker: _Worker, when: str) -> str:
    info = worker.info
    tail = worker.process.log_tail(LOG_TAIL_LINES)
    return (
        f"worker {info.name} (pid {info.pid}) {_describe_exit(info.exit_code)} {when}.\n"
        f"log: {info.log_path}\n"
        f"--- last {LOG_TAIL_LINES} log lines ---\n{tail}\n--- end of log ---\n"
        "fix: read the error in the log above; rerun the worker's command by hand to reproduce it"
    )


def _timeout_message(spec: WorkerGroupSpec, pending: list[_Worker], last_probe: dict[int, str], timeout: float) -> str:
    lines = [f"{len(pending)} worker(s) of group {spec.name!r} not ready after {timeout:.1f}s:"]
    for worker in pending:
        detail = last_probe.get(worker.info.rank, "not probed yet")
        lines.append(f"  {worker.info.name} (pid {worker.info.pid}): last probe: {detail}; log: {worker.info.log_path}")
    first = pending[0]
    lines.append(f"--- last {LOG_TAIL_LINES} log lines of {first.info.name} ---")
    lines.append(first.process.log_tail(LOG_TAIL_LINES))
    lines.append("--- end of log ---")
    lines.append(
        f"fix: check that the worker serves its {spec.readiness.kind} readiness target "
        f"({spec.readiness.target}), or raise the timeout (ready_timeout_s; this wait used {timeout:.1f}s) "
        "if it is just slow"
    )
    return "\n".join(lines)
