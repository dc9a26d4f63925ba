"""The scheduler registry: every *built* scheduler kind and the class that implements it.

The one list of scheduler kinds. ``make_scheduler`` builds from it, the Airflow cluster hooks
(``operators/hooks/cluster.py``) look their kind up in it, config validation refuses a
``cluster.scheduler`` that is not in it, and the DAGs offer its names as the ``scheduler`` Param.
The config grammar also knows the kinds in :data:`PLANNED_SCHEDULERS` (``cluster.scheduler`` may
name them); they are refused, before anything starts, as planned but not built. A new backend
implements :class:`~areal_tasks.api.scheduler.Scheduler` and registers itself here.

Torch-free, and importing this module imports no implementation.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any

from areal_tasks.api.scheduler import Scheduler
from areal_tasks.errors import SchedulerError
from areal_tasks.registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "PLANNED_SCHEDULERS",
    "SCHEDULERS",
    "check_scheduler",
    "make_scheduler",
    "scheduler_kinds",
    "unsupported_reason",
]

#: built scheduler kind -> its :class:`Scheduler` class (imported on first use).
SCHEDULERS: Registry[type[Scheduler]] = Registry(
    "scheduler", {"local": "areal_tasks.launch.local:LocalScheduler"}, error=SchedulerError
)

#: kinds that ``cluster.scheduler`` accepts but that have no implementation yet.
PLANNED_SCHEDULERS: tuple[str, ...] = ("ray", "slurm", "skypilot")


def scheduler_kinds() -> tuple[str, ...]:
    """The built scheduler kinds, sorted."""
    return SCHEDULERS.names()


def unsupported_reason(kind: object) -> str | None:
    """Why ``kind`` cannot be used (planned but not built, or unknown), or None when it is built."""
    if kind in SCHEDULERS:
        return None
    supported = ", ".join(scheduler_kinds())
    if kind in PLANNED_SCHEDULERS:
        return f"scheduler {kind!r} (planned, not built yet) is not supported; supported schedulers: {supported}"
    close = difflib.get_close_matches(str(kind), scheduler_kinds(), n=1, cutoff=0.5)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"scheduler {kind!r} (unknown) is not supported; {guess}supported schedulers: {supported}"


def check_scheduler(kind: object) -> None:
    """Raise :class:`SchedulerError` naming the supported kinds unless ``kind`` is built."""
    reason = unsupported_reason(kind)
    if reason is not None:
        raise SchedulerError(reason)


def make_scheduler(kind: str, **kwargs: Any) -> Scheduler:
    """Build the scheduler of ``kind``; ``kwargs`` go to its constructor (e.g. ``run_dir=``)."""
    check_scheduler(kind)
    scheduler = SCHEDULERS.build(kind, **kwargs)
    if not isinstance(scheduler, Scheduler):
        raise SchedulerError(f"scheduler {kind!r} built {type(scheduler).__name__}, which is not a Scheduler")
    return scheduler
