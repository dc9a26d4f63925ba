"""The driver's view of a Ray cluster: whether this process may be a driver, and the job's placement group.

:func:`on_ray_node` answers without ``ray.init`` (a Ray driver on a machine that is not a node of the
cluster aborts the whole process with an error Python cannot catch). :func:`job_placement_group`
reserves one bundle per node for the job (STRICT_SPREAD over several nodes, PACK for one), bundle 0
on the driver's own node when that node has the resources, and returns the nodes in bundle order:
bundle ``i`` is node ``i``. Waiting is bounded; on timeout the message lists what the cluster has
against what was asked.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from areal_tasks.api.scheduler import NodeInfo
from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = ["job_placement_group", "on_ray_node"]

_RAYLET_SOCKET = Path("session_latest") / "sockets" / "raylet"


def on_ray_node(temp_dir: str | None = None) -> bool:
    """Whether this process may be a Ray driver: started by the Jobs API (``RAY_ADDRESS`` names a
    GCS, not a dashboard URL) or on a machine with a live raylet. Never calls ``ray.init``."""
    address = os.environ.get("RAY_ADDRESS", "")
    if address and not address.startswith(("http://", "https://", "ray://")):
        return True
    root = Path(temp_dir or os.environ.get("RAY_TMPDIR") or "/tmp/ray")
    sock_path = root / _RAYLET_SOCKET
    if not sock_path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(sock_path))
        except OSError:  # a stale socket of a stopped Ray
            return False
    return True


def job_placement_group(
    n_nodes: int, cpus_per_node: float | None, gpus_per_node: int, timeout_s: float
) -> tuple[PlacementGroup, list[NodeInfo]]:
    """Reserve ``n_nodes`` bundles (``cpus_per_node`` None = the smallest alive node's CPUs); return
    the ready group and its nodes (SchedulerError naming the cluster's nodes on timeout)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    cpus = cpus_per_node
    if cpus is None:
        cpus = min((n["Resources"].get("CPU", 0.0) for n in alive), default=0.0) or 1.0
    bundle: dict[str, float] = {"CPU": float(cpus)}
    if gpus_per_node > 0:
        bundle["GPU"] = float(gpus_per_node)
    strategy = "STRICT_SPREAD" if n_nodes > 1 else "PACK"
    bundles = [dict(bundle) for _ in range(n_nodes)]
    here = ray.util.get_node_ip_address()
    mine = [n for n in alive if n.get("NodeManagerAddress") == here]
    if mine and all(mine[0]["Resources"].get(k, 0.0) >= v for k, v in bundle.items()):
        # node 0 is the controller's own node when it fits: rank 0 and the controller then share it
        bundles[0][f"node:{here}"] = 0.001
    pg = placement_group(bundles, strategy=strategy)
    if not pg.wait(timeout_s):
        remove_placement_group(pg)
        have = ", ".join(
            f"{n.get('NodeManagerHostname')} ({n.get('NodeManagerAddress')}): "
            f"CPU {n['Resources'].get('CPU', 0):g}, GPU {n['Resources'].get('GPU', 0):g}"
            for n in alive
        )
        raise SchedulerError(
            f"the Ray cluster could not place {n_nodes} node bundle(s) of {bundle} ({strategy}) within "
            f"{timeout_s:g}s; alive nodes: {have or 'none'}. Lower cluster.nodes, "
            "cluster.cpus_per_node or cluster.gpus_per_node, add nodes, or raise cluster.ray.placement_timeout_s"
        )
    table = placement_group_table(pg)
    by_id = {n["NodeID"]: n for n in ray.nodes()}
    nodes = []
    for index in range(n_nodes):
        node = by_id[table["bundles_to_node_id"][index]]
        nodes.append(
            NodeInfo(
                index=index,
                name=str(node.get("NodeManagerHostname") or node["NodeManagerAddress"]),
                address=str(node["NodeManagerAddress"]),
                cpus=float(cpus),
                gpus=int(gpus_per_node),
            )
        )
    logger.info("Ray placement group ready: %s", "; ".join(n.label for n in nodes))
    return pg, nodes
