"""Scheduler implementations: the only code that starts processes (see ``areal_tasks.api.scheduler``).

``LocalScheduler`` runs worker groups as local subprocesses; ``make_scheduler(kind, **kw)`` picks an
implementation by name.
"""

from areal_tasks.launch.factory import SUPPORTED_KINDS, make_scheduler
from areal_tasks.launch.local import LocalScheduler

__all__ = ["SUPPORTED_KINDS", "LocalScheduler", "make_scheduler"]
