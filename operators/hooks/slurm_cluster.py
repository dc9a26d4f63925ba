"""SlurmClusterHook: the RL job as a SLURM batch job, submitted from the Airflow worker (a submit host).

The cluster is described by the Airflow connection ``areal_slurm`` (conn type ``generic``); every
field is in its ``extra`` (JSON), and each has a default when the connection, or the field, is absent:

===============  ==========================================================  ====================================
extra            meaning                                                     default
===============  ==========================================================  ====================================
``slurm_conf``   the cluster's ``slurm.conf`` on the Airflow worker          ``$SLURM_CONF``, else
                                                                             ``/etc/slurm/slurm.conf`` (must exist)
``partition``    ``--partition``                                             the cluster's default partition
``account``      ``--account``                                               none
``qos``          ``--qos``                                                   none
``python``       the interpreter as the nodes see it                         this interpreter
``workdir``      the project directory as the nodes see it (``--chdir``)     the job's cwd
``setup``        shell lines run first in the batch script (a list, or one   none
                 string with one line per line)
``jobs_root``    where job records live (shared with the batch host)         the operator's ``jobs_root``
===============  ==========================================================  ====================================

Jobs go through :class:`areal_tasks.launch.slurm.jobs.SlurmJobs`; ``check_resources`` is the SLURM
preflight (the partition is UP, ``sbatch --test-only`` accepts the nodes and GPUs). Every
SchedulerError becomes an ArealAirflowError with SLURM's message. Importing this module imports no
``areal_tasks`` module that needs torch: they load inside the methods.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from operators.exceptions import ArealAirflowError
from operators.hooks.cluster import CLUSTER_HOOKS, ClusterHook

if TYPE_CHECKING:
    from areal_tasks.config.cluster import ClusterConfig
    from areal_tasks.launch.slurm.jobs import SlurmJobs

__all__ = ["SlurmClusterHook"]

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
EXTRA_FIELDS = ("slurm_conf", "partition", "account", "qos", "python", "workdir", "setup", "jobs_root")


class SlurmClusterHook(ClusterHook):
    """Jobs of a SLURM cluster (see the module docstring for the connection and its defaults)."""

    scheduler = "slurm"
    conn_name_attr = "conn_id"
    default_conn_name = "areal_slurm"
    conn_type = "generic"
    hook_name = "AReaL SLURM cluster"
    submit_error = "cannot submit job {name} to SLURM"
    lookup_error = "cannot look up SLURM job {name}"
    cancel_error = "cannot cancel SLURM job {name}"

    def __init__(
        self,
        jobs_root: str | os.PathLike[str] | None = None,
        conn_id: str = default_conn_name,
        nodes: int = 1,
        gpus_per_node: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node: int | None = None
        self.memory_gb_per_node: float | None = None
        self._jobs_root = None if jobs_root is None else str(jobs_root)
        self._settings: dict[str, Any] | None = None
        self._jobs: SlurmJobs | None = None

    # ------------------------------------------------------------------ connection

    def settings(self) -> dict[str, Any]:
        """The connection's fields with their defaults filled in (ArealAirflowError when slurm.conf is missing)."""
        if self._settings is None:
            from airflow.sdk.exceptions import AirflowNotFoundException

            try:
                extra = dict(self.get_connection(self.conn_id).extra_dejson or {})
            except AirflowNotFoundException:
                extra = {}
            unknown = sorted(set(extra) - set(EXTRA_FIELDS))
            if unknown:
                raise ArealAirflowError(
                    f"connection {self.conn_id!r}: unknown extra field(s) {unknown}; known: {', '.join(EXTRA_FIELDS)}"
                )
            conf = extra.get("slurm_conf") or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF
            if not Path(conf).is_file():
                raise ArealAirflowError(
                    f"slurm.conf not found at {conf}: set the extra field 'slurm_conf' of the Airflow connection "
                    f"{self.conn_id!r} (conn type generic) or $SLURM_CONF on the Airflow worker to the cluster's "
                    "slurm.conf (the worker must be a SLURM submit host)"
                )
            setup = extra.get("setup") or []
            if isinstance(setup, str):
                setup = [line for line in setup.splitlines() if line.strip()]
            jobs_root = extra.get("jobs_root") or self._jobs_root
            if not jobs_root:
                raise ArealAirflowError(
                    f"SlurmClusterHook needs a jobs root: pass jobs_root or set the extra field 'jobs_root' of "
                    f"connection {self.conn_id!r} (a directory the batch host shares)"
                )
            self._settings = {**extra, "slurm_conf": conf, "setup": list(setup), "jobs_root": str(jobs_root)}
        return self._settings

    def cluster_config(self) -> ClusterConfig:
        """The ``cluster`` section the connection describes (scheduler slurm, this hook's nodes and GPUs)."""
        from areal_tasks.config.cluster import ClusterConfig, SlurmConfig

        s = self.settings()
        slurm = SlurmConfig(
            partition=s.get("partition"),
            account=s.get("account"),
            qos=s.get("qos"),
            python=s.get("python"),
            workdir=s.get("workdir"),
            setup=s["setup"],
            slurm_conf=s["slurm_conf"],
        )
        return ClusterConfig(
            scheduler="slurm",
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            cpus_per_node=self.cpus_per_node,
            memory_gb_per_node=self.memory_gb_per_node,
            slurm=slurm,
        )

    def size_jobs(self, cluster: ClusterConfig) -> None:
        """The batch jobs submitted next ask for ``cluster``'s nodes, GPUs, CPUs and memory per node
        (the connection still gives partition, account, qos, python, workdir, setup, slurm.conf)."""
        self.nodes = cluster.nodes
        self.gpus_per_node = cluster.gpus_per_node
        self.cpus_per_node = cluster.cpus_per_node
        self.memory_gb_per_node = cluster.memory_gb_per_node
        self._jobs = None  # rebuilt with the new shape

    def get_conn(self) -> SlurmJobs:
        if self._jobs is None:
            from areal_tasks.errors import SchedulerError
            from areal_tasks.launch.slurm.jobs import SlurmJobs

            try:
                self._jobs = SlurmJobs(self.settings()["jobs_root"], self.cluster_config())
            except SchedulerError as exc:
                raise ArealAirflowError(f"cannot use the SLURM cluster of connection {self.conn_id!r}: {exc}") from exc
        return self._jobs

    def check_resources(
        self, allocation_mode: str, n_gpus: int = 0, min_memory_gb: float = 1.0, *, nodes: int | None = None
    ) -> dict[str, Any]:
        """SLURM's preflight for ``nodes`` nodes (default: the hook's) and the GPUs per node the allocation needs.

        With ``n_gpus > 0`` the allocation's GPUs are spread over the nodes (``ceil(gpus / nodes)`` per
        node, at least ``gpus_per_node``); ``min_memory_gb`` is left to SLURM (``--mem`` in the job).
        """
        from areal_tasks.launch.slurm.preflight import preflight

        if n_gpus < 0:
            raise ArealAirflowError(f"n_gpus={n_gpus} must be >= 0 (0 = CPU only)")
        alloc = self._parse_allocation(allocation_mode)
        nodes = self.nodes if nodes is None else nodes
        if nodes < 1:
            raise ArealAirflowError(f"nodes={nodes} must be >= 1")
        gpus_needed = alloc.total_gpus if n_gpus > 0 else 0
        per_node = max(self.gpus_per_node, math.ceil(gpus_needed / nodes)) if gpus_needed else 0
        report = self._call(
            "the SLURM cluster cannot run this job",
            lambda: preflight(self.cluster_config().slurm, nodes=nodes, gpus_per_node=per_node),
        )
        return {**report, "allocation": alloc.spec, "gpus_needed": gpus_needed, "min_memory_gb": min_memory_gb}


CLUSTER_HOOKS[SlurmClusterHook.scheduler] = SlurmClusterHook
