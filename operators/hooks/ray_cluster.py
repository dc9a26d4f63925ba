"""The Ray cluster hook: the RL job as a Ray Jobs API submission, and the cluster's resource check.

:class:`RayClusterHook` serves ``cluster.scheduler: ray``. It talks to the cluster's dashboard
through :class:`areal_tasks.launch.ray.jobs.RayJobs` (REST only: neither ``ray`` nor torch is
imported, here or by the Airflow worker and triggerer that use it). The connection ``areal_ray``
(conn type ``http``) says where the dashboard is and how to authenticate:

* host, port, schema: the dashboard / Jobs API URL, e.g. host ``head``, port ``8265``, schema
  ``http`` (a host that already holds ``http://...`` is used as it is);
* password: the cluster's token (a cluster run with ``RAY_AUTH_MODE=token``); registered with
  Airflow's secret masker. Without one the job's environment variables are readable by anyone who
  can reach the dashboard, and a warning says so;
* extra (JSON): ``python`` and ``workdir`` as the head sees them (the job's interpreter and working
  directory), ``env`` (a dict of non-secret variables every job gets), ``request_timeout_s`` (30)
  and ``stop_wait_s`` (30).

Without the connection: ``$RAY_API_SERVER_ADDRESS``, else ``http://127.0.0.1:8265``, no token,
``sys.executable`` and the current directory. Every :class:`~areal_tasks.errors.SchedulerError`
becomes an :class:`~operators.exceptions.ArealAirflowError`.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from operators.exceptions import ArealAirflowError
from operators.hooks.cluster import CLUSTER_HOOKS, ClusterHook

if TYPE_CHECKING:
    from areal_tasks.api.jobs import JobStatus
    from areal_tasks.launch.ray.jobs import RayJobs

__all__ = ["RayClusterHook", "RayConnection"]

DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8265"


@dataclass(frozen=True)
class RayConnection:
    """What the ``areal_ray`` connection (or its defaults) says."""

    url: str
    token: str | None = None
    python: str = sys.executable
    workdir: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 30.0
    stop_wait_s: float = 30.0


class RayClusterHook(ClusterHook):
    """Jobs on a Ray cluster through its Jobs API (see the module docstring for the connection)."""

    scheduler = "ray"
    conn_name_attr = "ray_conn_id"
    default_conn_name = "areal_ray"
    conn_type = "http"
    hook_name = "AReaL Ray cluster"

    def __init__(
        self, ray_conn_id: str | None = None, jobs_root: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        #: ``jobs_root`` is accepted for the generic callers and not used: Ray keeps the job records.
        self.ray_conn_id = ray_conn_id or self.default_conn_name
        self._connection: RayConnection | None = None
        self._jobs: RayJobs | None = None

    # -- connection ----------------------------------------------------------------------------

    @property
    def connection(self) -> RayConnection:
        """The resolved connection (defaults when ``areal_ray`` is not defined); secrets masked."""
        if self._connection is None:
            self._connection = self._resolve()
            if self._connection.token:
                from airflow.sdk.log import mask_secret

                mask_secret(self._connection.token)
        return self._connection

    def _resolve(self) -> RayConnection:
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            conn = None
        if conn is None:
            url = os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_DASHBOARD_URL
            return RayConnection(url=url.rstrip("/"))
        extra = conn.extra_dejson or {}
        host = (conn.host or "").strip()
        if not host:
            url = os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_DASHBOARD_URL
        elif "://" in host:
            url = host
        else:
            url = f"{conn.schema or 'http'}://{host}:{conn.port or 8265}"
        env = extra.get("env") or {}
        if not isinstance(env, dict):
            raise ArealAirflowError(f"connection {self.ray_conn_id!r}: extra.env must be a JSON object, got {env!r}")
        return RayConnection(
            url=url.rstrip("/"),
            token=conn.password or None,
            python=str(extra.get("python") or sys.executable),
            workdir=str(extra.get("workdir") or os.getcwd()),
            env={str(k): str(v) for k, v in env.items()},
            request_timeout_s=float(extra.get("request_timeout_s", 30.0)),
            stop_wait_s=float(extra.get("stop_wait_s", 30.0)),
        )

    def get_conn(self) -> RayJobs:
        if self._jobs is None:
            from areal_tasks.launch.ray.jobs import RayJobs

            c = self.connection
            self._jobs = RayJobs(
                c.url,
                token=c.token,
                request_timeout_s=c.request_timeout_s,
                stop_wait_s=c.stop_wait_s,
                workdir=c.workdir,
            )
        return self._jobs

    # -- jobs ----------------------------------------------------------------------------------

    def submit_job(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        *,
        cwd: str | None = None,
    ) -> JobStatus:
        from airflow.sdk.log import mask_secret

        full = {**self.connection.env, **(env or {})}
        for value in (env or {}).values():  # the caller's values may be secrets (the connection's env is not)
            if value:
                mask_secret(value)
        return self._call(
            self.submit_error.format(name=name), lambda: self.get_conn().submit(name, argv, full, run_dir, cwd=cwd)
        )

    def job_log_tail(self, name: str, lines: int = 40) -> str:
        return self._call(f"cannot read the log of job {name}", lambda: self.get_conn().log_tail(name, lines))

    # -- resources -----------------------------------------------------------------------------

    def check_resources(
        self,
        allocation_mode: str,
        n_gpus: int = 0,
        min_memory_gb: float = 1.0,
        *,
        nodes: int = 1,
        cpus_per_node: float | None = None,
    ) -> dict[str, Any]:
        """The cluster has ``nodes`` alive nodes with the GPUs per node the allocation needs.

        ``n_gpus=0`` is a CPU run. With ``n_gpus > 0`` each node needs ``ceil(gpus / nodes)`` GPUs.
        ``min_memory_gb`` is not checked here (Ray reports memory per node; the job's own checks
        run on the nodes).
        """
        from areal_tasks.launch.ray import preflight

        if n_gpus < 0:
            raise ArealAirflowError(f"n_gpus={n_gpus} must be >= 0 (0 = CPU only)")
        if nodes < 1:
            raise ArealAirflowError(f"nodes={nodes} must be >= 1")
        alloc = self._parse_allocation(allocation_mode)
        gpus_needed = alloc.total_gpus if n_gpus > 0 else 0
        if gpus_needed > n_gpus > 0:
            raise ArealAirflowError(
                f"allocation {allocation_mode!r} needs {gpus_needed} GPUs but n_gpus={n_gpus}; raise n_gpus or "
                "shrink the allocation"
            )
        gpus_per_node = math.ceil(gpus_needed / nodes) if gpus_needed else 0
        report = self._call(
            "the Ray cluster cannot run this job",
            lambda: preflight.check_resources(self.get_conn().dashboard, nodes, gpus_per_node, cpus_per_node),
        )
        return {
            "scheduler": self.scheduler,
            "allocation": alloc.spec,
            "nodes": nodes,
            "gpus_needed": gpus_needed,
            "gpus_per_node": gpus_per_node,
            "ok": True,
            **report,
        }


CLUSTER_HOOKS[RayClusterHook.scheduler] = RayClusterHook
