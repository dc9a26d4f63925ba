"""Cluster hooks: submit, look up and cancel the RL job, and check the resources it needs.

:class:`ClusterHook` is the interface, one implementation per scheduler kind: :data:`CLUSTER_HOOKS`
maps a kind to its hook class. Which kinds exist, and the refusal of those that are planned but not
built and of launchers that are not schedulers (``skypilot``), come from the one scheduler registry,
:mod:`areal_tasks.launch.registry`, which :func:`get_cluster_hook` asks first. ``local``
(:class:`LocalClusterHook`, over :class:`areal_tasks.launch.jobs.LocalJobs`) runs the job detached on
this machine; it outlives the Airflow task that submitted it. ``ray``
(:class:`~operators.hooks.ray_cluster.RayClusterHook`, connection ``areal_ray``) submits it to a Ray
cluster's Jobs API; ``slurm`` (:class:`~operators.hooks.slurm_cluster.SlurmClusterHook`, connection
``areal_slurm``) as a SLURM batch job.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook

from operators.exceptions import ArealAirflowError

if TYPE_CHECKING:
    from areal_tasks.api.jobs import JobBackend, JobStatus
    from areal_tasks.config.allocation import AllocationMode
    from areal_tasks.config.cluster import ClusterConfig
    from areal_tasks.launch.jobs import LocalJobs

__all__ = ["CLUSTER_HOOKS", "ClusterHook", "LocalClusterHook", "get_cluster_hook"]

T = TypeVar("T")


class ClusterHook(BaseHook, abc.ABC):
    """Jobs and resources of one scheduler backend.

    The job methods call the backend's :class:`~areal_tasks.api.jobs.JobBackend` (:meth:`get_conn`)
    and turn the SchedulerError of a failed submit, look-up or cancel into an ArealAirflowError that
    begins with the hook's :attr:`submit_error`, :attr:`lookup_error` or :attr:`cancel_error`; a
    backend overrides one where it does more (the Ray hook adds the connection's environment).
    :meth:`check_resources` is each backend's own.
    """

    #: the scheduler kind this hook serves (``cluster.scheduler`` in a job config).
    scheduler: str = ""
    #: how the ArealAirflowError of a failed submit, look-up or cancel begins (``{name}``: the job's name).
    submit_error: str = "cannot submit job {name}"
    lookup_error: str = "cannot look up job {name}"
    cancel_error: str = "cannot cancel job {name}"

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
        return self._call(
            self.submit_error.format(name=name), lambda: self.get_conn().submit(name, argv, env, run_dir, cwd=cwd)
        )

    def get_job(self, name: str) -> JobStatus:
        """The state of job ``name`` (``missing`` if it was never submitted)."""
        return self._call(self.lookup_error.format(name=name), lambda: self.get_conn().status(name))

    def cancel_job(self, name: str, grace_s: float = 30.0) -> JobStatus:
        """Stop job ``name`` and everything it started: gracefully, then forcefully after ``grace_s``."""
        return self._call(self.cancel_error.format(name=name), lambda: self.get_conn().cancel(name, grace_s))

    def job_log_tail(self, name: str, lines: int = 40) -> str:
        """The last ``lines`` lines of the job's log."""
        return self.get_conn().log_tail(name, lines)

    @abc.abstractmethod
    def check_resources(
        self, allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0, *, nodes: int = 1
    ) -> dict[str, Any]:
        """Check that the allocation fits on ``nodes`` nodes of the cluster; return a report, raise
        ArealAirflowError listing what is short."""

    def size_jobs(self, cluster: ClusterConfig) -> None:
        """Size the jobs submitted next by the job config's ``cluster`` section (nodes, GPUs, CPUs and
        memory per node). Only hooks whose job asks the cluster for its size use it (a SLURM batch
        job is as large as its ``--nodes``); the default does nothing."""

    def get_conn(self) -> JobBackend:
        """The backend client (what the hook calls into)."""
        raise NotImplementedError

    @staticmethod
    def _parse_allocation(allocation_mode: str) -> AllocationMode:
        """``allocation_mode`` parsed; ArealAirflowError naming it when it is not valid."""
        from areal_tasks.config.allocation import parse_allocation
        from areal_tasks.errors import AllocationError

        try:
            return parse_allocation(allocation_mode)
        except AllocationError as exc:
            raise ArealAirflowError(f"allocation_mode {allocation_mode!r} is not valid: {exc}") from exc

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, with a SchedulerError it raises turned into an ArealAirflowError ``"{what}: {error}"``."""
        from areal_tasks.errors import SchedulerError

        try:
            return fn()
        except SchedulerError as exc:
            raise ArealAirflowError(f"{what}: {exc}") from exc


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

    def check_resources(
        self, allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0, *, nodes: int = 1
    ) -> dict[str, Any]:
        """CPUs, GPUs, memory and free loopback ports for ``allocation_mode`` on this machine
        (:func:`areal_tasks.launch.resources.check_local_resources`, also the local scheduler's preflight);
        ArealAirflowError listing every shortage. This machine is one node."""
        from areal_tasks.errors import AllocationError
        from areal_tasks.launch.resources import check_local_resources

        if nodes != 1:
            raise ArealAirflowError(
                f"the local scheduler runs on this one machine, but nodes={nodes}; several nodes need the ray or "
                "slurm scheduler"
            )
        if n_gpus < 0:
            raise ArealAirflowError(f"n_gpus={n_gpus} must be >= 0 (0 = CPU only)")
        try:
            report = check_local_resources(allocation_mode, n_gpus, min_memory_gb)
        except AllocationError as exc:
            raise ArealAirflowError(f"allocation_mode {allocation_mode!r} is not valid: {exc}") from exc
        problems = report.pop("problems")
        for warning in report["warnings"]:
            self.log.warning("%s", warning)
        if problems:
            raise ArealAirflowError("the local machine cannot run this job:\n- " + "\n- ".join(problems))
        return {"scheduler": self.scheduler, **report}


#: scheduler kind -> its hook class; every kind of the scheduler registry has one (a unit test checks).
CLUSTER_HOOKS: dict[str, type[ClusterHook]] = {LocalClusterHook.scheduler: LocalClusterHook}


def get_cluster_hook(scheduler: str, *, jobs_root: str | os.PathLike[str], conn_id: str | None = None) -> ClusterHook:
    """The cluster hook of ``scheduler``; ArealAirflowError, naming the supported kinds, for a kind the
    scheduler registry has not built.

    ``jobs_root`` is where job records live (the local hook keeps its jobs there; others may keep
    their records there too). ``conn_id`` names the Airflow connection of a cluster hook (its
    ``conn_name_attr``); None uses the hook's default connection (``areal_ray``, ``areal_slurm``).
    """
    from areal_tasks.launch.registry import unsupported_reason

    reason = unsupported_reason(scheduler)
    if reason is not None:
        raise ArealAirflowError(reason)
    hook = CLUSTER_HOOKS.get(scheduler)
    if hook is None:
        raise ArealAirflowError(
            f"scheduler {scheduler!r} is built but has no cluster hook; register one in operators.hooks.cluster"
        )
    kwargs: dict[str, Any] = {"jobs_root": jobs_root}
    if conn_id:
        attr = getattr(hook, "conn_name_attr", None)
        if not attr:
            raise ArealAirflowError(
                f"scheduler {scheduler!r} takes no Airflow connection, but conn_id={conn_id!r} was given; drop it"
            )
        kwargs[attr] = conn_id
    return hook(**kwargs)


# The hooks of the other kinds live in modules of their own and add themselves to CLUSTER_HOOKS; a plain
# import (not `from ... import`) also works when one of them is imported first and imports this module.
import operators.hooks.ray_cluster  # noqa: E402
import operators.hooks.slurm_cluster  # noqa: E402, F401
