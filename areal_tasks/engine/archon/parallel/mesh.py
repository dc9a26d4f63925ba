"""The archon engine's device meshes: ``pp x dp x cp x tp`` for the dense parameters and the
activations, and ``pp x edp x ep x tp`` over the same ranks for the experts.

Ranks are laid out row-major: tensor-parallel peers adjacent (one node, NVLink), then context-
parallel peers, data-parallel replicas, and pipeline stages outermost (stages exchange only
activations, the least traffic, so they may span nodes). FSDP2 shards the dense parameters over the
flattened ``dp x cp`` ranks (context-parallel ranks see different tokens of the same sequences, so
their gradients reduce like data-parallel ones).

Expert parallelism adds no ranks: the ``dp x cp`` ranks of one stage and tensor coordinate are
regrouped into ``edp x ep``: ``ep`` consecutive ones split the experts between them, and FSDP2
shards each expert slice over the ``edp`` ranks that hold the same slice. Both meshes share the
world, so an expert parameter is a DTensor sharded on ``ep`` and then by FSDP on ``edp``, and DCP
sees every parameter with its global shape (a checkpoint reshards to any layout).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.api.train_engine import ParallelInfo
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

logger = logging.getLogger(__name__)

__all__ = ["ArchonMesh"]


class ArchonMesh:
    """The built meshes and the process groups of one archon engine."""

    def __init__(self, dims: ParallelDims, device_type: str) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        world = dist.get_world_size()
        if dims.world_size != world:
            raise EngineError(
                f"parallel dims dp={dims.dp} x cp={dims.sp} x tp={dims.tp} x pp={dims.pp} = {dims.world_size} "
                f"do not match the world size {world}"
            )
        self.dims = dims
        self.mesh: DeviceMesh = init_device_mesh(
            device_type, (dims.pp, dims.dp, dims.sp, dims.tp), mesh_dim_names=("pp", "dp", "cp", "tp")
        )
        self.fsdp_mesh: DeviceMesh = self.mesh["dp", "cp"]._flatten("dp_cp")
        edp = dims.dp * dims.sp // dims.ep
        ranks = torch.arange(world).reshape(dims.pp, edp, dims.ep, dims.tp)
        self.expert_mesh: DeviceMesh = DeviceMesh(device_type, ranks, mesh_dim_names=("pp", "edp", "ep", "tp"))
        logger.info(
            "archon mesh pp=%d dp=%d cp=%d tp=%d (experts: edp=%d ep=%d)",
            dims.pp,
            dims.dp,
            dims.sp,
            dims.tp,
            edp,
            dims.ep,
        )

    def group(self, name: str) -> ProcessGroup:
        """The process group of one mesh dim: ``pp``, ``dp``, ``cp``, ``tp``, ``dp_cp``, ``ep``, ``edp``."""
        if name == "dp_cp":
            return self.fsdp_mesh.get_group()
        if name in ("ep", "edp"):
            return self.expert_mesh.get_group(name)
        return self.mesh.get_group(name)

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp")

    def info(self) -> ParallelInfo:
        import torch.distributed as dist

        pp_rank, dp_rank, cp_rank, tp_rank = (self.mesh.get_local_rank(n) for n in ("pp", "dp", "cp", "tp"))
        return ParallelInfo(
            world_size=dist.get_world_size(),
            rank=dist.get_rank(),
            dp_size=self.dims.dp,
            dp_rank=dp_rank,
            tp_size=self.dims.tp,
            tp_rank=tp_rank,
            sp_size=self.dims.sp,
            sp_rank=cp_rank,
            pp_size=self.dims.pp,
            pp_rank=pp_rank,
            ep_size=self.dims.ep,
            ep_rank=self.expert_mesh.get_local_rank("ep"),
        )
