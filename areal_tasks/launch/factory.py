"""``make_scheduler(kind, **kw)``: the one place that maps a scheduler kind to its implementation.

Only ``local`` exists today. Ray, SLURM and SkyPilot backends implement the same
:class:`~areal_tasks.api.scheduler.Scheduler` interface and get a branch here when they land.
"""

from __future__ import annotations

from typing import Any

from areal_tasks.api.scheduler import Scheduler
from areal_tasks.errors import SchedulerError

__all__ = ["SUPPORTED_KINDS", "make_scheduler"]

SUPPORTED_KINDS = ("local",)
_PLANNED_KINDS = ("ray", "slurm", "skypilot")


def make_scheduler(kind: str, **kwargs: Any) -> Scheduler:
    """Build the scheduler of ``kind``; ``kwargs`` go to its constructor (e.g. ``run_dir=``)."""
    if kind == "local":
        from areal_tasks.launch.local import LocalScheduler

        return LocalScheduler(**kwargs)
    planned = " (planned, not implemented yet)" if kind in _PLANNED_KINDS else ""
    raise SchedulerError(
        f"scheduler kind {kind!r}{planned} is not supported; supported kinds: {', '.join(SUPPORTED_KINDS)}"
    )
