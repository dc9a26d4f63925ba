"""What one Ray worker runs: its argv, environment, working directory and readiness target (pure).

Placeholders expand as in every backend (``{host}`` = the worker's node address, ``{node}`` its
index). The environment is the controller's, minus what belongs to the controller's own node or
Ray process (``RAY_*``, ``CUDA_VISIBLE_DEVICES``, host name, process markers), plus the spec's,
``AREAL_NODE_ADDR`` and, for torch.distributed groups, :func:`~areal_tasks.api.scheduler.torch_distributed_env`
with ``MASTER_ADDR`` = rank 0's node. The supervisor overlays it on its own node's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from areal_tasks.api.scheduler import (
    NODE_ADDR_ENV,
    OWN_DEVICES_ENV,
    NodeInfo,
    WorkerGroupSpec,
    WorkerInfo,
    expand_placeholders,
    torch_distributed_env,
)
from areal_tasks.launch.process import MARKER_ENV

__all__ = ["NODE_LOCAL_ENV", "WorkerPlan", "plan_worker"]

#: variables of the controller's environment that never reach a worker on another node.
NODE_LOCAL_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", MARKER_ENV, NODE_ADDR_ENV, OWN_DEVICES_ENV}
)


@dataclass(frozen=True)
class WorkerPlan:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    ready_target: str


def plan_worker(
    spec: WorkerGroupSpec,
    info: WorkerInfo,
    nodes: list[NodeInfo],
    master_port: int | None,
    run_dir: Path,
    controller_env: Mapping[str, str] | None = None,
    controller_cwd: str | None = None,
) -> WorkerPlan:
    """The plan of worker ``info`` (its ports and node already chosen) of ``spec``."""
    values: dict[str, object] = {
        "rank": info.rank,
        "world_size": spec.replicas,
        "host": info.host,
        "node": info.node,
        "run_dir": run_dir,
        "group": spec.name,
    }
    values.update({f"port_{i}": port for i, port in enumerate(info.ports)})
    if info.ports:
        values["port"] = info.ports[0]
    if master_port is not None:
        values["master_port"] = master_port
    argv = [expand_placeholders(part, values) for part in spec.command]
    cwd = expand_placeholders(spec.cwd, values) if spec.cwd is not None else (controller_cwd or os.getcwd())
    source = os.environ if controller_env is None else controller_env
    env = {k: v for k, v in source.items() if k not in NODE_LOCAL_ENV and not k.startswith("RAY_")}
    env.update({key: expand_placeholders(value, values) for key, value in spec.env.items()})
    env[NODE_ADDR_ENV] = info.host
    if master_port is not None:
        env.update(torch_distributed_env(spec, info.rank, nodes[spec.node_of(0)].address, master_port))
    target = expand_placeholders(spec.readiness.target, values)
    if spec.readiness.kind == "file":
        target = os.path.join(cwd, target)
    return WorkerPlan(argv, env, cwd, target)
