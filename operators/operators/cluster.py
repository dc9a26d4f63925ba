"""``ProvisionClusterOperator``: checks that the chosen scheduler has what the allocation needs.

On ``local`` that is CPUs, GPUs, memory and free loopback ports (see
:meth:`~operators.hooks.cluster.LocalClusterHook.check_resources`); every shortage is listed in one
error. Other scheduler kinds are refused with the list of supported ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.exceptions import ArealAirflowError
from operators.operators.training import resolve_jobs_root

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ProvisionClusterOperator"]


class ProvisionClusterOperator(BaseOperator):
    """Check ``allocation_mode`` (e.g. ``embedded:d1+fsdp:d2``) on ``scheduler``; XCom: the resource report.

    :param n_gpus: GPUs for the run (0 = CPU: world sizes count processes).
    :param nodes: nodes the job runs on (``cluster.nodes``).
    :param conn_id: the cluster hook's Airflow connection (its default when None).
    :param min_memory_gb: memory that must be available, GB.
    """

    template_fields = ("scheduler", "conn_id", "allocation_mode", "n_gpus", "nodes", "min_memory_gb")
    ui_color = "#dcd0f0"

    def __init__(
        self,
        *,
        allocation_mode: str,
        scheduler: str = "local",
        n_gpus: int | str = 0,
        nodes: int | str = 1,
        conn_id: str | None = None,
        min_memory_gb: float | str = 1.0,
        jobs_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.allocation_mode = allocation_mode
        self.scheduler = scheduler
        self.n_gpus = n_gpus
        self.nodes = nodes
        self.conn_id = conn_id
        self.min_memory_gb = min_memory_gb
        self.jobs_root = jobs_root

    def execute(self, context: Context) -> dict[str, Any]:
        from operators.hooks.cluster import get_cluster_hook

        try:
            n_gpus, nodes, min_memory_gb = int(self.n_gpus), int(self.nodes), float(self.min_memory_gb)
        except ValueError as exc:
            raise ArealAirflowError(
                f"n_gpus={self.n_gpus!r}, nodes={self.nodes!r} and min_memory_gb={self.min_memory_gb!r} must be numbers"
            ) from exc
        conn_id = None if self.conn_id in (None, "", "None") else str(self.conn_id)
        hook = get_cluster_hook(self.scheduler, jobs_root=resolve_jobs_root(self.jobs_root), conn_id=conn_id)
        report = hook.check_resources(str(self.allocation_mode), n_gpus, min_memory_gb, nodes=nodes)
        self.log.info("%s scheduler can run %s: %s", self.scheduler, self.allocation_mode, report)
        return report
