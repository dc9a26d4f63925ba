"""Cluster hooks: submit, look up and cancel the RL job, and check the resources it needs.

:class:`ClusterHook` is the interface, one implementation per scheduler kind: :data:`CLUSTER_HOOKS`
maps a kind to its hook class. Which kinds exist, and the refusal of those that are planned but not
built and of launchers that are not schedulers (``skypilot``), come from the one scheduler registry,
:mod:`areal_tasks.launch.registry`, which :func:`get_cluster_hook` asks first. ``local``
(:class:`LocalClusterHook`, over :class:`areal_tasks.launch.jobs.LocalJobs`) runs the job detached on
this machine; it outlives the Airflow task that submitted it. ``ray``
(:class:`~operators.hooks.ray_cluster.RayClusterHook`, connection ``areal_ray``) submits it to a Ray
cluster's Jobs API.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from operators.exceptions import ArealAirflowError

if TYPE_CHECKING:
    from areal_tasks.api.jobs import JobStatus
    from areal_tasks.launch.jobs import LocalJobs

__all__ = ["CLUSTER_HOOKS", "ClusterHook", "LocalClusterHook", "get_cluster_hook"]


class ClusterHook(BaseHook, abc.ABC):
    """Jobs and resources of one scheduler backend."""

    #: the scheduler kind this hook serves (``cluster.scheduler`` in a job config).
    scheduler: str = ""

    @abc.abstractmethod
    def submit_job(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        *,
        cwd: str | None = None,
    ) -> JobStatus:
        """Start ``argv`` as job ``name`` (refused while a job of that name runs)."""

    @abc.abstractmethod
    def get_job(self, name: str) -> JobStatus:
        """The state of job ``name`` (``missing`` if it was never submitted)."""

    @abc.abstractmethod
    def cancel_job(self, name: str, grace_s: float = 30.0) -> JobStatus:
        """Stop job ``name`` and everything it started: gracefully, then forcefully after ``grace_s``."""

    @abc.abstractmethod
    def job_log_tail(self, name: str, lines: int = 40) -> str:
        """The last ``lines`` lines of the job's log."""

    @abc.abstractmethod
    def check_resources(self, allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0) -> dict[str, Any]:
        """Check that the allocation fits; return a report, raise ArealAirflowError listing what is short."""

    def get_conn(self) -> Any:
        """The backend client (what the hook calls into)."""
        raise NotImplementedError


class LocalClusterHook(ClusterHook):
    """Jobs on this machine, recorded under ``jobs_root`` (see :mod:`areal_tasks.launch.jobs`)."""

    scheduler = "local"
    hook_name = "AReaL local scheduler"

    def __init__(self, jobs_root: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not jobs_root:
            raise ArealAirflowError("LocalClusterHook needs jobs_root: the directory where job records live")
        self.jobs_root = Path(jobs_root)
        self._jobs: LocalJobs | None = None

    def get_conn(self) -> LocalJobs:
        if self._jobs is None:
            from areal_tasks.launch.jobs import LocalJobs

            self._jobs = LocalJobs(self.jobs_root)
        return self._jobs

    def submit_job(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        *,
        cwd: str | None = None,
    ) -> JobStatus:
        from areal_tasks.errors import SchedulerError

        try:
            return self.get_conn().submit(name, argv, env, run_dir, cwd=cwd)
        except SchedulerError as exc:
            raise ArealAirflowError(f"cannot submit job {name}: {exc}") from exc

    def get_job(self, name: str) -> JobStatus:
        from areal_tasks.errors import SchedulerError

        try:
            return self.get_conn().status(name)
        except SchedulerError as exc:
            raise ArealAirflowError(f"cannot look up job {name}: {exc}") from exc

    def cancel_job(self, name: str, grace_s: float = 30.0) -> JobStatus:
        from areal_tasks.errors import SchedulerError

        try:
            return self.get_conn().cancel(name, grace_s)
        except SchedulerError as exc:
            raise ArealAirflowError(f"cannot cancel job {name}: {exc}") from exc

    def job_log_tail(self, name: str, lines: int = 40) -> str:
        return self.get_conn().log_tail(name, lines)

    def check_resources(self, allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0) -> dict[str, Any]:
        """CPUs, GPUs, memory and free loopback ports for ``allocation_mode`` on this machine.

        ``n_gpus=0`` is a CPU run: the allocation's world sizes count processes. With ``n_gpus > 0``
        the allocation's GPUs must fit in ``n_gpus`` and in the GPUs this machine shows. Memory is
        compared with ``MemAvailable``. One port per inference server plus one rendezvous port per
        training component must be free. Oversubscribed CPUs are a warning, not a failure.
        """
        from areal_tasks.config.allocation import parse_allocation
        from areal_tasks.errors import AllocationError, SchedulerError
        from areal_tasks.launch.devices import detect_devices
        from areal_tasks.launch.ports import PortAllocator

        if n_gpus < 0:
            raise ArealAirflowError(f"n_gpus={n_gpus} must be >= 0 (0 = CPU only)")
        try:
            alloc = parse_allocation(allocation_mode)
        except AllocationError as exc:
            raise ArealAirflowError(f"allocation_mode {allocation_mode!r} is not valid: {exc}") from exc
        processes = sum(c.world_size for c in alloc.components)
        cpus = len(os.sched_getaffinity(0))
        devices = detect_devices()
        memory_gb = _available_memory_gb()
        problems: list[str] = []
        warnings: list[str] = []
        gpus_needed = alloc.total_gpus if n_gpus > 0 else 0
        if n_gpus > 0:
            if gpus_needed > n_gpus:
                problems.append(
                    f"allocation {allocation_mode!r} needs {gpus_needed} GPUs but n_gpus={n_gpus}; "
                    "raise n_gpus or shrink the allocation"
                )
            if len(devices) < gpus_needed:
                problems.append(
                    f"allocation {allocation_mode!r} needs {gpus_needed} GPUs but this machine shows "
                    f"{len(devices)} ({','.join(devices) or 'none'}); run on a bigger machine, "
                    "shrink the allocation, or set n_gpus=0 for a CPU run"
                )
        elif processes > cpus:
            warnings.append(f"{processes} processes on {cpus} CPU core(s): oversubscribed, expect a slow run")
        if memory_gb is not None and memory_gb < min_memory_gb:
            problems.append(
                f"{memory_gb:.1f} GB of memory available, {min_memory_gb:.1f} GB required; "
                "stop other jobs or lower min_memory_gb"
            )
        n_ports = sum(c.world_size for c in alloc.inference()) + len(alloc.training())
        allocator = PortAllocator()
        try:
            allocator.release(allocator.allocate(n_ports))
        except SchedulerError as exc:
            problems.append(f"{n_ports} free loopback ports needed: {exc}")
        report = {
            "scheduler": self.scheduler,
            "allocation": alloc.spec,
            "processes": processes,
            "cpus": cpus,
            "gpus_detected": len(devices),
            "gpus_needed": gpus_needed,
            "memory_available_gb": None if memory_gb is None else round(memory_gb, 2),
            "min_memory_gb": min_memory_gb,
            "ports_checked": n_ports,
            "warnings": warnings,
            "ok": not problems,
        }
        for warning in warnings:
            self.log.warning("%s", warning)
        if problems:
            raise ArealAirflowError("the local machine cannot run this job:\n- " + "\n- ".join(problems))
        return report


from operators.hooks.ray_cluster import RayClusterHook  # noqa: E402 - it subclasses ClusterHook above

#: scheduler kind -> its hook class; every kind of the scheduler registry has one (a unit test checks).
CLUSTER_HOOKS: dict[str, type[ClusterHook]] = {
    LocalClusterHook.scheduler: LocalClusterHook,
    RayClusterHook.scheduler: RayClusterHook,
}


def get_cluster_hook(scheduler: str, **kwargs: Any) -> ClusterHook:
    """The cluster hook of ``scheduler`` (``local`` takes ``jobs_root=``); ArealAirflowError, naming the
    supported kinds, for a kind the scheduler registry has not built."""
    from areal_tasks.launch.registry import unsupported_reason

    reason = unsupported_reason(scheduler)
    if reason is not None:
        raise ArealAirflowError(reason)
    hook = CLUSTER_HOOKS.get(scheduler)
    if hook is None:
        raise ArealAirflowError(
            f"scheduler {scheduler!r} is built but has no cluster hook; register one in operators.hooks.cluster"
        )
    return hook(**kwargs)


def _available_memory_gb() -> float | None:
    """``MemAvailable`` in GB (10^9 bytes) from /proc/meminfo; None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return None
