"""RayScheduler: worker groups as supervisor actors in one job-wide placement group.

The scheduler is a Ray driver, so it runs only on a node of the Ray cluster (a Ray driver on any
other machine aborts the whole process with an error Python cannot catch):
:meth:`RayScheduler.can_run_controller_here` checks that without calling ``ray.init``, and the
constructor refuses otherwise.

Layout. One placement group for the job: a bundle of ``{"CPU": cpus_per_node, "GPU": gpus_per_node}``
per node, STRICT_SPREAD over several nodes (PACK for one); bundle ``i`` is node ``i``
(:meth:`nodes`), and bundle 0 is pinned to the controller's own node when that node has the
resources (on a head started with ``--num-cpus=0`` it is not, and node 0 is then any node). Every
worker is one :class:`~areal_tasks.launch.ray.supervisor.Supervisor` actor pinned to the bundle of
its ``placement`` node, reserving ``cpus_per_worker`` CPUs and ``devices_per_worker`` GPUs there.
The supervisor picks the worker's ports on its node, starts it (log at
``RunPaths.of(run_dir).worker_log(group, rank)``, written on the node) and stops it. The worker's
environment (the controller's, minus node-local variables, plus the spec's) goes as a method
argument, never as ``runtime_env``. ``MASTER_ADDR`` is rank 0's node; ``MASTER_PORT`` is picked by
rank 0's supervisor.

Remote calls. Every call waits at most ``call_timeout_s`` (actor creation and start:
``start_timeout_s``). A supervisor that Ray reports dead (``ActorDiedError``) fails its worker
with the node named as lost; one that is unreachable (``ActorUnavailableError``, a call timing
out) fails it once that has lasted ``unavailable_grace_s``.

Stop. ``stop_group`` asks every supervisor to stop its worker (SIGTERM, then SIGKILL after the
grace), then kills the actors; if an actor dies first, its reaper kills the worker's tree.
``stop_all`` also removes the placement group (a later ``start_group`` makes a new one).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.api.scheduler import (
    NodeInfo,
    WorkerGroupSpec,
    WorkerInfo,
    WorkerStatus,
)
from areal_tasks.errors import SchedulerError, WorkerFailedError
from areal_tasks.launch import cleanup
from areal_tasks.launch.base import GroupScheduler
from areal_tasks.launch.process import read_log_tail
from areal_tasks.launch.ray import messages
from areal_tasks.launch.ray import preflight as ray_preflight
from areal_tasks.launch.ray.cluster import job_placement_group, on_ray_node
from areal_tasks.launch.ray.messages import LOG_TAIL_LINES
from areal_tasks.launch.ray.plan import plan_worker
from areal_tasks.launch.ray.supervisor import Supervisor
from areal_tasks.launch.readiness import ProbeResult

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["RayScheduler", "on_ray_node"]

_POLL_S = 0.2

_RemoteSupervisor = ray.remote(Supervisor)


@dataclass
class _Worker:
    info: WorkerInfo
    actor: Any
    ready_target: str
    stop_requested: bool = False
    unhealthy_since: float | None = None
    reason: str = ""


@dataclass
class _Group:
    spec: WorkerGroupSpec
    workers: list[_Worker] = field(default_factory=list)
    ports: dict[int, list[int]] = field(default_factory=dict)  # node index -> ports held
    released: bool = False


class RayScheduler(GroupScheduler[_Group, _Worker]):
    """Runs worker groups as processes started by supervisor actors on a Ray cluster.

    Args:
        run_dir: root of the run (shared storage: every node writes its workers' logs under it).
        address: the Ray cluster to join (``auto``: this node's); the namespace of the actors.
        nodes: how many nodes (bundles) the job's placement group spans.
        cpus_per_node: CPUs of each bundle; None = the smallest alive node's CPUs.
        gpus_per_node: GPUs of each bundle.
        placement_timeout_s: how long to wait for the placement group.
        call_timeout_s: how long any one supervisor call may take (``start_timeout_s``: creating
            the actors and starting the workers).
        unavailable_grace_s: how long a supervisor may be unreachable before its worker counts as failed.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        address: str = "auto",
        namespace: str | None = None,
        nodes: int = 1,
        cpus_per_node: float | None = None,
        gpus_per_node: int = 0,
        placement_timeout_s: float = 120.0,
        call_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        unavailable_grace_s: float = 10.0,
        handle_signals: bool = True,
    ) -> None:
        if not on_ray_node():
            raise SchedulerError(
                "this machine is not a node of the Ray cluster (no RAY_ADDRESS, no local raylet), and a Ray driver "
                "anywhere else aborts the process; run `areal train` through the cluster (outside it, it submits "
                "itself as a Ray job) or use `areal launch ray`"
            )
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.n_nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = gpus_per_node
        self.placement_timeout_s = placement_timeout_s
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.unavailable_grace_s = unavailable_grace_s
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level="WARNING")
        self._groups: dict[str, _Group] = {}
        self._lock = threading.RLock()
        self._pg: PlacementGroup | None = None
        self._nodes: list[NodeInfo] = []
        self._make_placement_group()
        cleanup.register(self, handle_signals=handle_signals)

    # -- class-level contract ------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: JobConfig) -> RayScheduler:
        """The scheduler of a job: its run dir, ``cluster.nodes``/``gpus_per_node``/``cpus_per_node``
        and ``cluster.ray``."""
        ray_cfg = cfg.cluster.ray
        namespace = ray_cfg.namespace or f"areal-{cfg.experiment.name}-{cfg.experiment.trial}"
        return cls(
            cfg.experiment.run_dir or ".",
            address=ray_cfg.address,
            namespace=namespace,
            nodes=cfg.cluster.nodes,
            cpus_per_node=cfg.cluster.cpus_per_node,
            gpus_per_node=cfg.cluster.gpus_per_node,
            placement_timeout_s=ray_cfg.placement_timeout_s,
            call_timeout_s=ray_cfg.call_timeout_s,
            start_timeout_s=max(120.0, ray_cfg.call_timeout_s),
        )

    @classmethod
    def can_run_controller_here(cls, cfg: JobConfig) -> bool:
        """Whether this machine is a node of the Ray cluster (checked without ``ray.init``)."""
        return on_ray_node()

    @classmethod
    def preflight(cls, cfg: JobConfig) -> dict[str, Any]:
        """The live check through the dashboard's REST API (works from outside the cluster)."""
        return ray_preflight.check_config(cfg)

    # -- Scheduler API -------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """The job's nodes: bundle ``i`` of the placement group is node ``i``."""
        with self._lock:
            if self._pg is None:
                self._make_placement_group()
            return list(self._nodes)

    def start_group(self, spec: WorkerGroupSpec) -> list[WorkerInfo]:
        nodes = self.nodes()
        beyond = sorted({node for node in spec.placement or [] if node >= len(nodes)})
        if beyond:
            raise SchedulerError(
                f"group {spec.name!r} places ranks on nodes {beyond}, but the job's Ray placement group has nodes "
                f"0..{len(nodes) - 1} (cluster.nodes={self.n_nodes}); raise cluster.nodes or fix the placement"
            )
        return self._start_named(_Group(spec), lambda group: self._launch(group, nodes))

    def status(self, group: str) -> list[WorkerInfo]:
        state = self._group(group)
        with self._lock:
            self._refresh_all(state.workers)
            return [copy.deepcopy(w.info) for w in state.workers]

    def check(self, group: str) -> None:
        state = self._group(group)
        self._refresh_all(state.workers)
        failed = [w for w in state.workers if w.info.status is WorkerStatus.FAILED]
        if failed:
            raise WorkerFailedError("\n\n".join(self._failure_message(w, "unexpectedly") for w in failed))

    def wait(self, group: str, timeout_s: float | None = None) -> list[WorkerInfo]:
        state = self._group(group)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._refresh_all(state.workers)
            running = [w.info.name for w in state.workers if not w.info.status.is_terminal]
            if not running:
                return self.status(group)
            if deadline is not None and time.monotonic() >= deadline:
                raise SchedulerError(
                    f"workers {', '.join(running)} of group {group!r} still run after {timeout_s}s; "
                    "raise the timeout, or stop_group() them if they hang (logs under "
                    f"{RunPaths.of(self.run_dir).worker_log(group, 0).parent})"
                )
            time.sleep(_POLL_S)

    def stop_all(self, grace_s: float = 10.0) -> None:
        with self._lock:
            groups = list(self._groups.values())
        try:
            self._stop(groups, grace_s)
        finally:
            with self._lock:
                pg, self._pg = self._pg, None
            if pg is not None and ray.is_initialized():
                remove_placement_group(pg)

    # -- placement -----------------------------------------------------------------------------

    def _make_placement_group(self) -> None:
        self._pg, self._nodes = job_placement_group(
            self.n_nodes, self.cpus_per_node, self.gpus_per_node, self.placement_timeout_s
        )

    # -- launching -----------------------------------------------------------------------------

    def _launch(self, group: _Group, nodes: list[NodeInfo]) -> None:
        spec = group.spec
        actors = [
            _RemoteSupervisor.options(
                num_cpus=spec.cpus_per_worker,
                num_gpus=spec.devices_per_worker,
                max_restarts=0,
                max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=spec.node_of(rank)
                ),
            ).remote(f"{spec.name}/{rank}")
            for rank in range(spec.replicas)
        ]
        for rank, actor in enumerate(actors):  # registered at once, so a failure below stops them too
            node = nodes[spec.node_of(rank)]
            info = WorkerInfo(
                group=spec.name,
                rank=rank,
                host=node.address,
                ports=[],
                log_path=str(RunPaths.of(self.run_dir).worker_log(spec.name, rank)),
                job_id=actor._actor_id.hex(),
                node=node.index,
            )
            group.workers.append(_Worker(info=info, actor=actor, ready_target=""))
        try:
            ray.get([a.node.remote() for a in actors], timeout=self.start_timeout_s)
        except GetTimeoutError as exc:
            raise SchedulerError(
                f"the {spec.replicas} supervisor actor(s) of group {spec.name!r} did not start within "
                f"{self.start_timeout_s:g}s: each needs {spec.cpus_per_worker:g} CPU and {spec.devices_per_worker} "
                f"GPU in its node's bundle ({nodes[0].cpus:g} CPU, {nodes[0].gpus} GPU per node, shared by the "
                "job's running groups); lower cpus_per_worker or raise cluster.cpus_per_node"
            ) from exc
        master_port = None
        for worker in group.workers:
            held = group.ports.setdefault(worker.info.node, [])
            count = spec.ports_per_worker + (1 if spec.torch_distributed and worker.info.rank == 0 else 0)
            ports = self._call(
                worker.actor.free_ports.remote(count, worker.info.host, self._held_ports(worker.info.node) + held)
            )
            held.extend(ports)
            if spec.torch_distributed and worker.info.rank == 0:
                master_port = ports.pop()
            worker.info.ports = ports
        starts = []
        for worker in group.workers:
            plan = plan_worker(spec, worker.info, nodes, master_port, self.run_dir)
            argv, env, cwd, target = plan.argv, plan.env, plan.cwd, plan.ready_target
            worker.ready_target = target
            ready_file = target if spec.readiness.kind == "file" else None
            starts.append(
                worker.actor.start.remote(
                    argv, env, cwd, worker.info.log_path, ready_file, spec.devices_per_worker, spec.hide_devices
                )
            )
        pids = self._call_all(starts, self.start_timeout_s, f"starting group {spec.name!r}")
        for worker, pid in zip(group.workers, pids):
            worker.info.pid = int(pid)
            worker.info.status = WorkerStatus.RUNNING if spec.readiness.kind == "none" else WorkerStatus.STARTING
            logger.info(
                "started %s on %s (pid %s); log %s", worker.info.name, _label(nodes, worker), pid, worker.info.log_path
            )

    def _held_ports(self, node: int) -> list[int]:
        with self._lock:
            return [p for g in self._groups.values() if not g.released for p in g.ports.get(node, [])]

    # -- remote calls --------------------------------------------------------------------------

    def _call(self, ref: Any, timeout: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=self.call_timeout_s if timeout is None else timeout)
        except GetTimeoutError as exc:
            raise SchedulerError(
                f"a supervisor call did not answer within {self.call_timeout_s:g}s (cluster.ray.call_timeout_s)"
            ) from exc
        except RayActorError as exc:
            raise SchedulerError(f"a supervisor actor died: {exc}") from exc

    def _call_all(self, refs: list[Any], timeout: float, what: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError as exc:
            raise SchedulerError(f"{what}: the supervisors did not answer within {timeout:g}s") from exc
        except RayActorError as exc:
            raise SchedulerError(f"{what}: a supervisor actor died: {exc}") from exc

    def _refresh_all(self, workers: list[_Worker]) -> None:
        live = [w for w in workers if not w.info.status.is_terminal]
        refs = [(w, w.actor.poll.remote()) for w in live]
        deadline = time.monotonic() + self.call_timeout_s
        for worker, ref in refs:
            self._refresh(worker, ref, max(0.0, deadline - time.monotonic()))

    def _refresh(self, worker: _Worker, ref: Any = None, timeout: float | None = None) -> WorkerStatus:
        """Poll ``worker``'s supervisor and record an exit or a lost node; returns the (new) status."""
        with self._lock:
            info = worker.info
            if info.status.is_terminal:
                return info.status
            try:
                code = ray.get(
                    worker.actor.poll.remote() if ref is None else ref,
                    timeout=self.call_timeout_s if timeout is None else timeout,
                )
            except ActorDiedError as exc:
                return self._lost(worker, f"its supervisor actor died ({messages.first_line(exc)})")
            except (ActorUnavailableError, GetTimeoutError) as exc:
                now = time.monotonic()
                worker.unhealthy_since = worker.unhealthy_since or now
                if now - worker.unhealthy_since >= self.unavailable_grace_s:
                    return self._lost(
                        worker,
                        f"its supervisor has been unreachable for {now - worker.unhealthy_since:.1f}s "
                        f"({type(exc).__name__})",
                    )
                return info.status
            except RayActorError as exc:
                return self._lost(worker, f"its supervisor actor failed ({messages.first_line(exc)})")
            worker.unhealthy_since = None
            if code is None:
                return info.status
            info.exit_code = int(code)
            if worker.stop_requested:
                info.status = WorkerStatus.STOPPED
            else:
                info.status = WorkerStatus.SUCCEEDED if code == 0 else WorkerStatus.FAILED
                log = logger.info if code == 0 else logger.error
                log("%s exited with code %s; log %s", info.name, code, info.log_path)
            return info.status

    def _lost(self, worker: _Worker, why: str) -> WorkerStatus:
        info = worker.info
        if worker.stop_requested:
            info.status = WorkerStatus.STOPPED
            return info.status
        node = self._nodes[info.node] if info.node < len(self._nodes) else None
        where = node.label if node is not None else f"node {info.node} ({info.host})"
        worker.reason = f"is gone with its supervisor on {where} ({why}; the node was lost, or the actor killed)"
        info.status = WorkerStatus.FAILED
        logger.error("%s failed: %s", info.name, worker.reason)
        return info.status

    def _probe(self, spec: WorkerGroupSpec, worker: _Worker) -> ProbeResult:
        """HTTP from the controller; a ``file`` target through the supervisor, on the worker's node."""
        if spec.readiness.kind != "file":
            return super()._probe(spec, worker)
        try:
            there = bool(self._call(worker.actor.exists.remote(worker.ready_target)))
        except SchedulerError as exc:
            return ProbeResult(False, f"could not check {worker.ready_target} on the node: {exc}")
        where = f"on node {worker.info.node} ({worker.info.host})"
        return ProbeResult(
            there,
            f"{worker.ready_target} exists {where}" if there else f"{worker.ready_target} does not exist yet {where}",
        )

    def _announce_ready(self, worker: _Worker, detail: str) -> None:
        logger.info("%s is ready (%s)", worker.info.name, detail)

    # -- stopping ------------------------------------------------------------------------------

    def _stop(self, groups: list[_Group], grace_s: float) -> None:
        with self._lock:
            workers = [w for g in groups for w in g.workers]
            self._refresh_all(workers)
            live = [w for w in workers if not w.info.status.is_terminal]
            for worker in live:
                worker.stop_requested = True
        refs = [(w, w.actor.stop.remote(grace_s)) for w in live]
        deadline = time.monotonic() + grace_s + self.call_timeout_s
        problems = []
        for worker, ref in refs:
            try:
                code = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (RayActorError, GetTimeoutError) as exc:  # its reaper kills the tree once the actor is gone
                logger.warning(
                    "stopping %s through its supervisor failed: %s", worker.info.name, messages.first_line(exc)
                )
                code = None
            except Exception as exc:  # noqa: BLE001 - reported below with the worker's name
                problems.append(f"{worker.info.name}: {exc}")
                code = None
            with self._lock:
                worker.info.exit_code = worker.info.exit_code if code is None else int(code)
                worker.info.status = WorkerStatus.STOPPED
        with self._lock:
            for group in groups:
                for worker in group.workers:
                    ray.kill(worker.actor, no_restart=True)
                group.released = True
        if problems:
            raise SchedulerError("could not stop every worker: " + "; ".join(problems))

    # -- messages ------------------------------------------------------------------------------

    def _tail(self, worker: _Worker) -> str:
        try:
            return str(ray.get(worker.actor.log_tail.remote(LOG_TAIL_LINES), timeout=min(10.0, self.call_timeout_s)))
        except (RayActorError, GetTimeoutError):  # the node is gone: the run dir is shared storage
            return read_log_tail(worker.info.log_path, LOG_TAIL_LINES)

    def _failure_message(self, worker: _Worker, when: str) -> str:
        return messages.failure(worker.info, self._where(worker.info), worker.reason, self._tail(worker), when)

    def _timeout_message(
        self, spec: WorkerGroupSpec, pending: list[_Worker], last_probe: dict[int, str], timeout: float
    ) -> str:
        infos = [w.info for w in pending]
        return messages.readiness_timeout(spec, infos, last_probe, timeout, self._tail(pending[0]))

    def _where(self, info: WorkerInfo) -> str:
        node = self._nodes[info.node] if info.node < len(self._nodes) else None
        return node.label if node is not None else f"node {info.node} ({info.host})"


def _label(nodes: list[NodeInfo], worker: _Worker) -> str:
    return nodes[worker.info.node].label
