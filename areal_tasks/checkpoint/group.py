"""The collectives a checkpoint needs, over a dedicated process group (or none, in one process).

The manager builds its own gloo group once, at construction (a collective: every rank builds its
manager at the same point). Async saves run their collectives on it from a background thread
while training uses the default group; DCP recommends exactly this. Without ``torch.distributed``
initialised everything degrades to a world of one.

:meth:`CheckpointGroup.on_coordinator` runs storage-only work (metadata, markers, pruning) on rank 0
and hands the result -- or the failure -- to every rank, so all ranks raise together instead of
some of them hanging in the next collective.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from areal_tasks.errors import CheckpointError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class CheckpointGroup:
    """Rank, world size and a few collectives for checkpointing."""

    def __init__(self, process_group: Any = None, *, distributed: bool = False) -> None:
        self.pg = process_group
        self.distributed = distributed
        if distributed:
            import torch.distributed as dist

            self.rank = dist.get_rank(process_group)
            self.world_size = dist.get_world_size(process_group)
        else:
            self.rank, self.world_size = 0, 1

    @classmethod
    def create(cls) -> CheckpointGroup:
        """A dedicated gloo group over all ranks when torch.distributed is up, else a world of one."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls(distributed=False)
        return cls(dist.new_group(backend="gloo"), distributed=True)

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.pg)

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (picklable objects)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.pg, 0), group=self.pg)
        return box[0]

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def on_coordinator(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` on rank 0; every rank returns its result or raises if it failed: a
        :class:`CheckpointError` (of whichever subclass, e.g. a damaged checkpoint) as rank 0 raised
        it, anything else as a CheckpointError naming ``what``."""
        outcome: tuple[bool, Any] = (True, None)
        failure: BaseException | None = None
        if self.is_coordinator:
            try:
                outcome = (True, fn())
            except Exception as exc:  # noqa: BLE001 - handed to every rank below, then re-raised here with its cause
                failure = exc
                shared = (
                    exc if isinstance(exc, CheckpointError) else f"{what} failed on rank 0: {type(exc).__name__}: {exc}"
                )
                outcome = (False, shared)
        outcome = self.broadcast(outcome)
        ok, value = outcome
        if ok:
            return value
        if isinstance(failure, CheckpointError):
            raise failure
        if isinstance(value, CheckpointError):
            raise value
        if failure is not None:
            raise CheckpointError(value) from failure
        raise CheckpointError(value)
