"""Which node runs each server and each train rank: one plan for every scheduler.

:func:`plan_placement` turns the allocation and the ``cluster`` section into node indices (into
:meth:`~areal_tasks.api.scheduler.Scheduler.nodes`), which the fleet and the trainer put into their
:class:`~areal_tasks.api.scheduler.WorkerGroupSpec` as ``placement``.

* **GPUs** (``cluster.gpus_per_node > 0``): nodes fill in order, servers first (each takes all the
  GPUs of its model-parallel group on one node), then the actor's ranks (one GPU each). A server
  needing more GPUs than a node has is refused, naming both numbers. A colocated actor
  (``sglang[rollout]:d2|fsdp[actor]:d2``) runs where the GPUs it shares are.
* **CPU** (``gpus_per_node: 0``): the actor's ranks go in contiguous blocks (rank ``r`` on node
  ``r * nodes // world``) so neighbours share a node; servers go round robin (server ``i`` on node
  ``i % nodes``). The demo's ``embedded:d1+fsdp:d2`` on two nodes: the server and rank 0 on node 0,
  rank 1 on node 1.

Pure and torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_tasks.config.allocation import parse_allocation
from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.errors import ConfigError

__all__ = ["JobPlacement", "plan_placement"]


@dataclass(frozen=True)
class JobPlacement:
    """The node index of every inference server and every actor rank."""

    servers: tuple[int, ...]
    actor: tuple[int, ...]
    nodes: int

    def to_dict(self, names: list[str] | None = None) -> dict[str, list[int] | list[str]]:
        """``{"servers": [...], "actor": [...]}``, as node names when ``names`` (by index) are given."""
        if names is None:
            return {"servers": list(self.servers), "actor": list(self.actor)}
        return {"servers": [names[n] for n in self.servers], "actor": [names[n] for n in self.actor]}


def plan_placement(allocation: str, cluster: ClusterConfig) -> JobPlacement:
    """The placement of ``allocation`` on ``cluster.nodes`` nodes (see the module docstring).

    Raises ConfigError naming the field to change when the allocation does not fit.
    """
    alloc = parse_allocation(allocation)
    inference = alloc.inference()
    if len(inference) > 1:
        raise ConfigError(
            f"allocation {allocation!r} has {len(inference)} inference components; "
            "one is supported (e.g. 'sglang:d2t2+fsdp:d4')"
        )
    n_servers = inference[0].dims.d if inference else 0
    server_gpus = (inference[0].dims.t * inference[0].dims.p * inference[0].dims.e) if inference else 0
    actor = alloc.actor()
    world = actor.dims.world_size
    nodes = cluster.nodes
    if cluster.gpus_per_node <= 0:
        return JobPlacement(
            servers=tuple(i % nodes for i in range(n_servers)),
            actor=tuple(r * nodes // world for r in range(world)),
            nodes=nodes,
        )
    return _place_on_gpus(allocation, n_servers, server_gpus, world, alloc.actor_shares_inference_gpus(), cluster)


def _place_on_gpus(
    allocation: str, n_servers: int, server_gpus: int, world: int, colocated: bool, cluster: ClusterConfig
) -> JobPlacement:
    per_node = cluster.gpus_per_node
    if server_gpus > per_node:
        raise ConfigError(
            f"allocation {allocation!r}: one inference server needs {server_gpus} GPUs (its t*p*e), but "
            f"cluster.gpus_per_node is {per_node}; a server runs on one node, so lower its tensor/pipeline/expert "
            "parallelism or use nodes with more GPUs"
        )
    free = [per_node] * cluster.nodes
    servers: list[int] = []
    for index in range(n_servers):
        node = next((n for n, left in enumerate(free) if left >= server_gpus), None)
        if node is None:
            raise ConfigError(
                f"allocation {allocation!r}: inference server {index} finds no node with {server_gpus} free GPUs "
                f"(cluster.nodes={cluster.nodes}, cluster.gpus_per_node={per_node}); raise cluster.nodes"
            )
        free[node] -= server_gpus
        servers.append(node)
    if colocated:
        if server_gpus == 0 or world != n_servers * server_gpus:
            raise ConfigError(
                f"allocation {allocation!r}: the colocated actor's {world} ranks must equal the servers' "
                f"{n_servers * server_gpus} GPUs"
            )
        actor = [servers[rank // server_gpus] for rank in range(world)]
    else:
        actor = []
        for rank in range(world):
            node = next((n for n, left in enumerate(free) if left >= 1), None)
            if node is None:
                raise ConfigError(
                    f"allocation {allocation!r}: actor rank {rank} finds no free GPU (cluster.nodes={cluster.nodes}, "
                    f"cluster.gpus_per_node={per_node}); raise cluster.nodes"
                )
            free[node] -= 1
            actor.append(node)
    return JobPlacement(servers=tuple(servers), actor=tuple(actor), nodes=cluster.nodes)
