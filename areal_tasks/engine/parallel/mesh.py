"""The dp x sp x tp device mesh of a train engine (the FSDP2 engine builds its shards on it), and
:class:`ParallelDims`, the rank layout every engine is built with (``pp`` and ``ep`` are run by the
archon engine, whose mesh is ``engine/archon/parallel/mesh.py``).

Ranks are laid out row-major over ``(dp, sp, tp)``: tensor-parallel peers are adjacent (on one node,
over NVLink), sequence-parallel peers next, data-parallel replicas outermost. Parameters are sharded
by FSDP2 over the flattened ``dp_sp`` dimension (sequence-parallel ranks see different tokens of the
same sequences, so their gradients are reduced like data-parallel ones) and split by DTensor tensor
parallelism over ``tp``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from areal_tasks.api.train_engine import ParallelInfo
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data, sequence (Ulysses), tensor and pipeline parallelism, whose product is the
    world size, and of expert parallelism, which adds no ranks: experts are split over groups of
    ``ep`` ranks taken from the ``dp x sp`` ranks of one pipeline stage and tensor coordinate."""

    dp: int = 1
    sp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "sp", "tp", "pp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EngineError(f"ParallelDims.{name} must be an integer >= 1, got {value!r}")
        if (self.dp * self.sp) % self.ep:
            raise EngineError(
                f"expert parallelism ep={self.ep} must divide dp*sp = {self.dp}*{self.sp}: experts are split "
                "over data- (and context-) parallel ranks; choose e dividing d*c"
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.sp * self.tp * self.pp

    @classmethod
    def for_world(cls, world_size: int, *, sp: int = 1, tp: int = 1) -> ParallelDims:
        """Fill ``dp`` so that ``dp * sp * tp == world_size``."""
        if world_size % (sp * tp) != 0:
            raise EngineError(
                f"world size {world_size} is not divisible by sp*tp = {sp}*{tp}; choose sp and tp that divide it"
            )
        return cls(dp=world_size // (sp * tp), sp=sp, tp=tp)


class EngineMesh:
    """The built mesh and the process groups the engine needs (dp, sp, tp, fsdp = dp x sp)."""

    def __init__(self, dims: ParallelDims, device_type: str) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        if dims.pp > 1 or dims.ep > 1:
            raise EngineError(
                f"this mesh runs dp x sp x tp only, got pp={dims.pp} ep={dims.ep}: pipeline and expert "
                "parallelism need the archon engine"
            )
        if dims.world_size != world:
            raise EngineError(
                f"parallel dims dp={dims.dp} x sp={dims.sp} x tp={dims.tp} = {dims.world_size} "
                f"do not match the world size {world}"
            )
        self.dims = dims
        self.mesh: DeviceMesh = init_device_mesh(
            device_type, (dims.dp, dims.sp, dims.tp), mesh_dim_names=("dp", "sp", "tp")
        )
        # FSDP shards over dp and sp together: both see different tokens of a replicated model.
        self.fsdp_mesh: DeviceMesh = self.mesh["dp", "sp"]._flatten("dp_sp")
        self.tp_mesh: DeviceMesh = self.mesh["tp"]
        logger.info("device mesh %s (dp=%d sp=%d tp=%d)", self.mesh, dims.dp, dims.sp, dims.tp)

    @property
    def dp_group(self) -> ProcessGroup:
        return self.mesh.get_group("dp")

    @property
    def sp_group(self) -> ProcessGroup:
        return self.mesh.get_group("sp")

    @property
    def tp_group(self) -> ProcessGroup:
        return self.mesh.get_group("tp")

    @property
    def fsdp_group(self) -> ProcessGroup:
        return self.fsdp_mesh.get_group()

    def info(self) -> ParallelInfo:
        import torch.distributed as dist

        coords = self.mesh.get_coordinate()
        if coords is None:
            raise EngineError("this rank is not part of the engine's device mesh")
        dp_rank, sp_rank, tp_rank = coords
        return ParallelInfo(
            world_size=dist.get_world_size(),
            rank=dist.get_rank(),
            dp_size=self.dims.dp,
            dp_rank=dp_rank,
            tp_size=self.dims.tp,
            tp_rank=tp_rank,
            sp_size=self.dims.sp,
            sp_rank=sp_rank,
        )
