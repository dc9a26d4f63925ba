"""Scheduler implementations: the only code that starts processes (see ``areal_tasks.api.scheduler``).

``LocalScheduler`` runs worker groups as local subprocesses; ``make_scheduler(kind, **kw)`` builds
the implementation of a kind registered in :mod:`areal_tasks.launch.registry`.
"""

from areal_tasks.launch.local import LocalScheduler
from areal_tasks.launch.registry import SCHEDULERS, check_scheduler, make_scheduler, scheduler_kinds

__all__ = ["SCHEDULERS", "LocalScheduler", "check_scheduler", "make_scheduler", "scheduler_kinds"]
