"""The few collectives the RL loop and the weight publisher need on the default process group.

Each is a no-op in a world of one (or before any process group exists), so the same code runs
single-process in tests and SPMD across train ranks.
"""

from __future__ import annotations

from typing import Any


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    """Wait for every rank of the default group (nothing to wait for in a world of one)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; other ranks' ``obj`` is ignored)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_int(value: int) -> int:
    """Rank 0's ``value`` on every rank."""
    return int(broadcast_object(value))
