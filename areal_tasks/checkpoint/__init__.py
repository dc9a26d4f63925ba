"""Crash-safe distributed checkpoints: DCP through ``storage`` (file, NFS, S3), exact resume,
incremental saves, retention, async saves and HF export.

The entry point is :class:`~areal_tasks.checkpoint.manager.CheckpointManager`; the trainer state it
round-trips is :class:`~areal_tasks.checkpoint.state.TrainerState`. Importing this package is
torch-free (torch loads when a save, load or export runs); see ``docs/checkpoints.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import CheckpointLayout
from areal_tasks.checkpoint.metadata import CheckpointMetadata
from areal_tasks.checkpoint.retention import PrunePlan, RetentionPolicy

if TYPE_CHECKING:
    from areal_tasks.checkpoint.listing import CheckpointInfo
    from areal_tasks.checkpoint.manager import CheckpointManager, SaveTicket
    from areal_tasks.checkpoint.state import TrainerState

__all__ = [
    "CheckpointInfo",
    "CheckpointLayout",
    "CheckpointManager",
    "CheckpointMetadata",
    "PrunePlan",
    "RetentionPolicy",
    "SaveTicket",
    "TrainerState",
]

_LAZY = {
    "CheckpointInfo": "areal_tasks.checkpoint.listing",
    "CheckpointManager": "areal_tasks.checkpoint.manager",
    "SaveTicket": "areal_tasks.checkpoint.manager",
    "TrainerState": "areal_tasks.checkpoint.state",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
