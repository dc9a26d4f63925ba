"""SlurmScheduler: every worker is one ``srun`` step inside a SLURM allocation.

Allocation (:mod:`.allocation`). Inside a batch job (``SLURM_JOB_ID`` set: ``areal train``
re-entered by the job's script) the scheduler uses that job's allocation. Outside one (the CLI or
the tests on the login node) it takes its own, ``salloc --no-shell --nodes=N --exclusive``, on
first use, and cancels it in :meth:`stop_all`. Either way every step names the job: ``srun
--jobid=ID --overlap``. Nodes come from the allocation, in SLURM's order.

Workers. Each worker is one ``srun`` client, a :class:`~areal_tasks.launch.process.WorkerProcess` on
the controller's machine (like a local worker), whose task runs on the node of its rank
(``spec.placement``); the client's exit code is the task's. The environment reaches the task through
the client's environment (``--export=ALL``), never its command line. Ports are picked on the node
where they will be bound, by a short step (``python -m areal_tasks.launch.ports``). ``MASTER_ADDR``
is rank 0's node address, and every worker gets ``AREAL_NODE_ADDR`` (its node's address).

Readiness is probed from the controller (HTTP to the node's address; ``file`` through the shared run
directory). A worker whose client exits uninvited has FAILED; the message names its node, quotes
its log and, when SLURM says the node is not up, says so (a lost node ends the allocation with
``NODE_FAIL`` after ``SlurmdTimeout``, and every step with it).

Stop: ``scancel --signal=TERM ID.STEP`` (it delivers the signal but exits 225, "Invalid job id
specified", a SLURM 22.05 quirk, ignored), ``grace_s`` for the client to exit, ``scancel ID.STEP``,
and after a bounded wait SIGKILL to a client still alive (a client whose node is gone may outlive
``scancel``). Multi-node runs need a run directory every node shares.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.scheduler import (
    NODE_ADDR_ENV,
    NodeInfo,
    WorkerGroupSpec,
    WorkerInfo,
    WorkerStatus,
    expand_placeholders,
    torch_distributed_env,
)
from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import SchedulerError, WorkerFailedError
from areal_tasks.launch import cleanup
from areal_tasks.launch.base import GroupScheduler
from areal_tasks.launch.process import WorkerProcess, stop_processes
from areal_tasks.launch.slurm.allocation import Allocation
from areal_tasks.launch.slurm.commands import resolve_slurm_conf, slurm_env
from areal_tasks.launch.slurm.script import container_wrapping, srun_step_argv

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["SlurmScheduler"]

LOG_TAIL_LINES = 40
#: seconds a client may outlive ``scancel ID.STEP`` before it gets SIGKILL.
CLIENT_KILL_WAIT_S = 10.0
#: seconds to wait for a just-started step to show in ``squeue`` before stopping its client instead.
STEP_LOOKUP_S = 2.0


@dataclass
class _Worker:
    info: WorkerInfo
    process: WorkerProcess
    ready_target: str
    node: NodeInfo
    stop_requested: bool = False
    #: why SLURM ended the worker's step without its client noticing (a lost node), if it did.
    lost: str = ""


@dataclass
class _Group:
    spec: WorkerGroupSpec
    workers: list[_Worker] = field(default_factory=list)
    ports: dict[int, list[int]] = field(default_factory=dict)  # node index -> ports held


class SlurmScheduler(GroupScheduler[_Group, _Worker]):
    """Runs worker groups as ``srun`` steps of one SLURM allocation (see the module docstring).

    Args:
        run_dir: root of the run (shared by the nodes); logs go under ``<run_dir>/logs``.
        nodes: how many nodes to allocate when this scheduler takes its own allocation.
        job_id: an allocation to use (default: ``$SLURM_JOB_ID``); None takes one with ``salloc``.
        slurm: the ``cluster.slurm`` section (partition, account, qos, time limit, container, python, slurm.conf).
        gpus_per_node: GPUs to ask for per node (``--gres=gpu:N``) and to report in :meth:`nodes`.
        alloc_timeout_s: how long ``salloc`` may wait for the nodes (``--immediate``).
        handle_signals: turn SIGTERM/SIGHUP of the controller into a normal exit that stops workers.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        nodes: int = 1,
        job_id: str | None = None,
        slurm: SlurmConfig | None = None,
        gpus_per_node: int = 0,
        alloc_timeout_s: float = 120.0,
        handle_signals: bool = True,
        name: str = "areal",
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.slurm = slurm or SlurmConfig()
        self.slurm_conf = resolve_slurm_conf(self.slurm.slurm_conf)
        self.python = self.slurm.python or sys.executable
        given = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID")
        self.allocation = Allocation(
            self.slurm_conf,
            self.slurm,
            job_id=given,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            name=name,
            timeout_s=alloc_timeout_s,
        )
        self._groups: dict[str, _Group] = {}
        self._lock = threading.RLock()
        cleanup.register(self, handle_signals=handle_signals)

    # -- class-level contract ------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: JobConfig) -> SlurmScheduler:
        """The scheduler of a job: its run directory, ``cluster.nodes``/``gpus_per_node`` and ``cluster.slurm``."""
        name = f"{cfg.experiment.name}-{cfg.experiment.trial}"
        return cls(
            cfg.experiment.run_dir or ".",
            nodes=cfg.cluster.nodes,
            slurm=cfg.cluster.slurm,
            gpus_per_node=cfg.cluster.gpus_per_node,
            name=name,
        )

    @classmethod
    def can_run_controller_here(cls, cfg: JobConfig) -> bool:
        """Inside a SLURM job (``SLURM_JOB_ID`` set): the controller runs in the job's allocation."""
        return bool(os.environ.get("SLURM_JOB_ID"))

    @classmethod
    def preflight(cls, cfg: JobConfig) -> dict[str, Any]:
        """The partition exists and is UP, and ``sbatch --test-only`` accepts the job's shape."""
        from areal_tasks.launch.slurm.preflight import preflight

        return preflight(cfg.cluster.slurm, nodes=cfg.cluster.nodes, gpus_per_node=cfg.cluster.gpus_per_node)

    # -- Scheduler API -------------------------------------------------------------------------

    @property
    def job_id(self) -> str:
        """The allocation's job id (taken with ``salloc`` on first use when there is none)."""
        return self.allocation.job_id

    def nodes(self) -> list[NodeInfo]:
        """The allocation's nodes in SLURM's order: name, ``NodeAddr``, ``CPUTot`` and the GPUs asked for."""
        return self.allocation.nodes()

    def start_group(self, spec: WorkerGroupSpec) -> list[WorkerInfo]:
        nodes = self.nodes()
        beyond = sorted({n for n in spec.placement or [] if n >= len(nodes)})
        if beyond:
            raise SchedulerError(
                f"group {spec.name!r} places ranks on nodes {beyond}, but SLURM allocation {self.job_id} has "
                f"{len(nodes)} node(s) (0..{len(nodes) - 1}); raise cluster.nodes or fix the placement"
            )
        return self._start_named(_Group(spec), lambda group: self._launch(group, nodes))

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
            raise WorkerFailedError("\n\n".join(self._failure_message(w, "unexpectedly") for w in failed))

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
                    f"raise the timeout, or stop_group() them if they hang (logs under {self.run_dir / 'logs' / group})"
                ) from exc
        return self.status(group)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every group, then cancel the allocation if this scheduler took it."""
        with self._lock:
            groups = list(self._groups.values())
        try:
            self._stop(groups, grace_s)
        finally:
            self.allocation.release()

    # -- internals -----------------------------------------------------------------------------

    def _refresh(self, worker: _Worker) -> WorkerStatus:
        with self._lock:
            info = worker.info
            if info.status.is_terminal:
                return info.status
            code = worker.process.poll()
            if code is None:
                ended = self.allocation.ended()
                if not ended:
                    return info.status
                # The allocation is gone (NODE_FAIL...): a client whose node was lost may never notice.
                worker.lost = f"SLURM ended allocation {self.allocation.known_id}: {ended}"
                stop_processes([worker.process], grace_s=0.0)
                code = worker.process.poll()
            info.exit_code = code
            if worker.stop_requested:
                info.status = WorkerStatus.STOPPED
            else:
                info.status = WorkerStatus.SUCCEEDED if code == 0 and not worker.lost else WorkerStatus.FAILED
                log = logger.info if info.status is WorkerStatus.SUCCEEDED else logger.error
                log("%s on %s exited with code %s; log %s", info.name, worker.node.label, code, info.log_path)
            return info.status

    def _held_ports(self, node: int) -> list[int]:
        return [p for g in self._groups.values() for p in g.ports.get(node, []) if not self._group_done(g)]

    def _group_done(self, group: _Group) -> bool:
        return bool(group.workers) and all(self._refresh(w).is_terminal for w in group.workers)

    def _launch(self, group: _Group, nodes: list[NodeInfo]) -> None:
        spec = group.spec
        wanted: dict[int, int] = {}
        for rank in range(spec.replicas):
            wanted[spec.node_of(rank)] = wanted.get(spec.node_of(rank), 0) + spec.ports_per_worker
        master_node = spec.node_of(0)
        if spec.torch_distributed:
            wanted[master_node] = wanted.get(master_node, 0) + 1
        for index, count in wanted.items():
            if count:
                group.ports[index] = self.allocation.pick_ports(
                    nodes[index], count, self._held_ports(index), self.python
                )
        free = {index: list(ports) for index, ports in group.ports.items()}
        master_port = free[master_node].pop(0) if spec.torch_distributed else None
        plans = []
        for rank in range(spec.replicas):
            node = nodes[spec.node_of(rank)]
            ports = [free[node.index].pop(0) for _ in range(spec.ports_per_worker)]
            plans.append(self._plan(spec, rank, node, ports, nodes[master_node].address, master_port))
        if spec.readiness.kind == "file":
            for info, _, _, target in plans:
                if os.path.exists(target):
                    logger.info("removing stale readiness file %s before starting %s", target, info.name)
                    os.remove(target)
        for info, argv, env, target in plans:
            process = WorkerProcess.spawn(info.name, argv, env, None, Path(info.log_path))
            info.pid = process.pid
            info.status = WorkerStatus.RUNNING if spec.readiness.kind == "none" else WorkerStatus.STARTING
            group.workers.append(_Worker(info, process, target, nodes[info.node]))

    def _plan(
        self,
        spec: WorkerGroupSpec,
        rank: int,
        node: NodeInfo,
        ports: list[int],
        master_addr: str,
        master_port: int | None,
    ) -> tuple[WorkerInfo, list[str], dict[str, str], str]:
        values: dict[str, object] = {
            "rank": rank,
            "world_size": spec.replicas,
            "host": node.address,
            "node": node.index,
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
        env = slurm_env(self.slurm_conf)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update({key: expand_placeholders(value, values) for key, value in spec.env.items()})
        env[NODE_ADDR_ENV] = node.address
        if master_port is not None:
            env.update(torch_distributed_env(spec, rank, master_addr, master_port))
        if spec.hide_devices and spec.devices_per_worker == 0:
            env["CUDA_VISIBLE_DEVICES"] = ""
        target = expand_placeholders(spec.readiness.target, values)
        if spec.readiness.kind == "file":
            target = os.path.join(cwd or os.getcwd(), target)
        log_path = RunPaths.of(self.run_dir).worker_log(spec.name, rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
        srun = srun_step_argv(
            job_id=self.job_id,
            node=node.name,
            name=f"{spec.name}-{rank}",
            log_path=log_path,
            argv=argv,
            cpus=spec.cpus_per_worker,
            gpus=spec.devices_per_worker,
            cwd=cwd or os.getcwd(),
            container=container_wrapping(self.slurm, self.run_dir, cwd, spec.devices_per_worker),
        )
        info = WorkerInfo(
            group=spec.name, rank=rank, host=node.address, ports=ports, log_path=str(log_path), node=node.index
        )
        return info, srun, env, target

    def _resolve_steps(self, workers: list[_Worker], wait_s: float = STEP_LOOKUP_S) -> None:
        """Fill ``info.job_id`` ("<job>.<step>") of ``workers`` whose client runs; a just-started step may
        take a moment to appear in ``squeue``, so look again for up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            missing = [w for w in workers if not w.info.job_id and w.process.poll() is None]
            if not missing:
                return
            steps = self.allocation.step_ids()
            for worker in missing:
                worker.info.job_id = steps.get(f"{worker.info.group}-{worker.info.rank}")
            if all(w.info.job_id for w in missing) or time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _stop(self, groups: list[_Group], grace_s: float) -> None:
        with self._lock:
            live = [w for g in groups for w in g.workers if not self._refresh(w).is_terminal]
            for worker in live:
                worker.stop_requested = True
        if live:
            self._resolve_steps(live)
            for worker in live:
                if worker.info.job_id:
                    logger.info(
                        "stopping %s (step %s on %s): SIGTERM", worker.info.name, worker.info.job_id, worker.node.label
                    )
                    self.allocation.scancel_step(worker.info.job_id, "TERM")
                else:  # no step (yet): srun itself cancels its step on SIGTERM
                    logger.info("stopping %s (no step known): SIGTERM to its srun client", worker.info.name)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.process.pid, signal.SIGTERM)
            left = _wait_clients(live, time.monotonic() + grace_s)
            for worker in left:
                logger.warning("%s did not stop within %.1fs of SIGTERM: cancelling it", worker.info.name, grace_s)
                if worker.info.job_id:
                    self.allocation.scancel_step(worker.info.job_id, None)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.process.pid, signal.SIGTERM)
            left = _wait_clients(left, time.monotonic() + CLIENT_KILL_WAIT_S)
            if left:
                logger.warning("srun clients of %s still alive: SIGKILL", ", ".join(w.info.name for w in left))
            stop_processes([w.process for w in left], grace_s=0.0)
        with self._lock:
            for group in groups:
                for worker in group.workers:
                    self._refresh(worker)

    def _announce_ready(self, worker: _Worker, detail: str) -> None:
        logger.info("%s is ready on %s (%s)", worker.info.name, worker.node.label, detail)

    def _failure_message(self, worker: _Worker, when: str) -> str:
        info = worker.info
        tail = worker.process.log_tail(LOG_TAIL_LINES)
        return (
            f"worker {info.name} on {worker.node.label} (srun client pid {info.pid}, "
            f"allocation {self.allocation.known_id}) "
            f"{_describe_exit(info.exit_code)} {when}."
            + "".join(f"\n{note}" for note in (self.allocation.node_note(worker.node), worker.lost) if note)
            + "\n"
            f"log: {info.log_path}\n"
            f"--- last {LOG_TAIL_LINES} log lines ---\n{tail}\n--- end of log ---\n"
            "fix: read the error in the log above; rerun the worker's command on that node to reproduce it"
        )

    def _timeout_message(
        self, spec: WorkerGroupSpec, pending: list[_Worker], last_probe: dict[int, str], timeout: float
    ) -> str:
        lines = [f"{len(pending)} worker(s) of group {spec.name!r} not ready after {timeout:.1f}s:"]
        for worker in pending:
            detail = last_probe.get(worker.info.rank, "not probed yet")
            lines.append(
                f"  {worker.info.name} on {worker.node.label}: last probe: {detail}; log: {worker.info.log_path}"
            )
        first = pending[0]
        lines += [
            f"--- last {LOG_TAIL_LINES} log lines of {first.info.name} ---",
            first.process.log_tail(LOG_TAIL_LINES),
            "--- end of log ---",
            f"fix: check that the worker serves its {spec.readiness.kind} readiness target ({spec.readiness.target}) "
            f"on its node's address, or raise the timeout (ready_timeout_s; this wait used {timeout:.1f}s) if it is "
            "just slow",
        ]
        return "\n".join(lines)


def _wait_clients(workers: list[_Worker], deadline: float) -> list[_Worker]:
    """Poll the srun clients until all have exited or ``deadline``; return those still running."""
    left = [w for w in workers if w.process.poll() is None]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [w for w in left if w.process.poll() is None]
    return left


def _describe_exit(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exited with exit code {code}"
    return f"was killed by signal {-code} (exit code {code})"
