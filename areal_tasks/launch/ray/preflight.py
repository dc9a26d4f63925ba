"""The live check of a Ray cluster before a job starts, over the dashboard's REST API (no ``ray`` import).

``GET /api/v0/nodes``: at least ``nodes`` ALIVE nodes, each with ``cpus_per_node`` CPUs (at least one
when unset) and ``gpus_per_node`` GPUs; ``GET /api/version``: a Ray version on the cluster other than
the one installed here is a warning (the job's own processes run the cluster's). Works from outside
the cluster (a login node, an Airflow worker) and inside it alike.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import SchedulerError
from areal_tasks.launch.ray.rest import RayDashboard

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["alive_nodes", "check_config", "check_resources"]


def alive_nodes(dashboard: RayDashboard) -> list[dict[str, Any]]:
    """The ALIVE nodes: ``{"address", "name", "head", "cpus", "gpus"}`` each."""
    answer = dashboard.get("/api/v0/nodes?limit=1000")
    try:
        rows = answer["data"]["result"]["result"]
    except (KeyError, TypeError) as exc:
        raise SchedulerError(f"unexpected answer of {dashboard.url}/api/v0/nodes: {str(answer)[:300]}") from exc
    out = []
    for row in rows:
        if row.get("state") != "ALIVE":
            continue
        total = row.get("resources_total") or {}
        out.append(
            {
                "address": row.get("node_ip"),
                "name": row.get("node_name") or row.get("node_ip"),
                "head": bool(row.get("is_head_node")),
                "cpus": float(total.get("CPU", 0.0)),
                "gpus": float(total.get("GPU", 0.0)),
            }
        )
    return out


def check_resources(
    dashboard: RayDashboard, nodes: int, gpus_per_node: int = 0, cpus_per_node: float | None = None
) -> dict[str, Any]:
    """Raise SchedulerError naming what is short; return ``{"dashboard", "ray_version", "nodes", "fit"}``."""
    alive = alive_nodes(dashboard)
    need_cpu = float(cpus_per_node) if cpus_per_node else 1.0
    fit = [n for n in alive if n["cpus"] >= need_cpu and n["gpus"] >= gpus_per_node]
    version = _cluster_version(dashboard)
    local = _local_version()
    if version and local and version != local:
        logger.warning(
            "the Ray cluster at %s runs ray %s, this machine has ray %s; the job runs the cluster's",
            dashboard.url,
            version,
            local,
        )
    report = {"dashboard": dashboard.url, "ray_version": version, "nodes": alive, "fit": len(fit)}
    if len(fit) < nodes:
        have = ", ".join(f"{n['name']} ({n['address']}): CPU {n['cpus']:g}, GPU {n['gpus']:g}" for n in alive)
        raise SchedulerError(
            f"the Ray cluster at {dashboard.url} has {len(fit)} alive node(s) with >= {need_cpu:g} CPU and "
            f">= {gpus_per_node} GPU, the job asks for {nodes} (cluster.nodes); alive nodes: {have or 'none'}. "
            "Add nodes to the cluster, or lower cluster.nodes / cluster.gpus_per_node / cluster.cpus_per_node"
        )
    return report


def check_config(cfg: JobConfig, token: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """:func:`check_resources` for a job's ``cluster`` section, on its dashboard URL."""
    cluster = cfg.cluster
    dashboard = RayDashboard(cluster.ray.dashboard_url, token=token, timeout_s=timeout_s)
    return check_resources(dashboard, cluster.nodes, cluster.gpus_per_node, cluster.cpus_per_node)


def _cluster_version(dashboard: RayDashboard) -> str | None:
    answer = dashboard.get("/api/version", missing_ok=True)
    return str(answer.get("ray_version")) if isinstance(answer, dict) and answer.get("ray_version") else None


def _local_version() -> str | None:
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None
