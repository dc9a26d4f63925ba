"""The scheduler registry: every *built* scheduler kind and the class that implements it.

The one list of scheduler kinds. ``make_scheduler`` builds from it, the Airflow cluster hooks
(``operators/hooks/cluster.py``) look their kind up in it, config validation refuses a
``cluster.scheduler`` that is not in it, and the DAGs offer its names as the ``scheduler`` Param.
The config grammar also knows the kinds in :data:`PLANNED_SCHEDULERS` (``cluster.scheduler`` may
name them); they are refused, before anything starts, as planned but not built, and the
:data:`LAUNCHERS` (``skypilot``), which provision machines and then run the job with a scheduler:
they are refused with the command that uses them. A new backend implements
:class:`~areal_tasks.api.scheduler.Scheduler` (with a ``from_config(cfg)`` class method) and a
:class:`~areal_tasks.api.jobs.JobBackend`, and registers both here.

Torch-free, and importing this module imports no implementation.
"""

from __future__ import annotations

import difflib
import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.api.jobs import JobBackend
from areal_tasks.api.scheduler import Scheduler
from areal_tasks.errors import SchedulerError
from areal_tasks.registry import Registry

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "JOB_BACKENDS",
    "LAUNCHERS",
    "PLANNED_SCHEDULERS",
    "SCHEDULERS",
    "check_scheduler",
    "job_backend_for",
    "make_job_backend",
    "make_scheduler",
    "make_scheduler_for",
    "preflight_for",
    "runs_here",
    "scheduler_kinds",
    "unsupported_reason",
]

#: built scheduler kind -> its :class:`Scheduler` class (imported on first use).
SCHEDULERS: Registry[type[Scheduler]] = Registry(
    "scheduler",
    {
        "local": "areal_tasks.launch.local:LocalScheduler",
        "ray": "areal_tasks.launch.ray.scheduler:RayScheduler",
        "slurm": "areal_tasks.launch.slurm:SlurmScheduler",
    },
    error=SchedulerError,
)

#: built scheduler kind -> its detached-job backend (:class:`~areal_tasks.api.jobs.JobBackend`).
JOB_BACKENDS: Registry[Any] = Registry(
    "job backend",
    {
        "local": "areal_tasks.launch.jobs:LocalJobs",
        "ray": "areal_tasks.launch.ray.jobs:RayJobs",
        "slurm": "areal_tasks.launch.slurm.jobs:SlurmJobs",
    },
    error=SchedulerError,
)

#: kinds that ``cluster.scheduler`` accepts but that have no implementation yet.
PLANNED_SCHEDULERS: tuple[str, ...] = ()

#: kinds the config grammar names that are launchers, not schedulers: kind -> how to use it.
LAUNCHERS: dict[str, str] = {
    "skypilot": (
        "SkyPilot provisions machines and then runs the job on them with the ray scheduler: write its task "
        "with `areal launch skypilot --config FILE` and start it with `sky launch`"
    ),
}


def scheduler_kinds() -> tuple[str, ...]:
    """The built scheduler kinds, sorted."""
    return SCHEDULERS.names()


def unsupported_reason(kind: object) -> str | None:
    """Why ``kind`` cannot be used (planned but not built, or unknown), or None when it is built."""
    if kind in SCHEDULERS:
        return None
    supported = ", ".join(scheduler_kinds())
    if isinstance(kind, str) and kind in LAUNCHERS:
        return f"{kind!r} is a launcher, not a scheduler: {LAUNCHERS[kind]}; supported schedulers: {supported}"
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


def make_scheduler_for(cfg: JobConfig) -> Scheduler:
    """The scheduler ``cfg.cluster.scheduler`` names, built from the job's config (its ``from_config``)."""
    kind = cfg.cluster.scheduler
    check_scheduler(kind)
    cls = SCHEDULERS.get(kind)
    from_config = getattr(cls, "from_config", None)
    if from_config is None:
        raise SchedulerError(f"scheduler {kind!r} ({cls.__name__}) has no from_config(cfg); it cannot run a job")
    scheduler = from_config(cfg)
    if not isinstance(scheduler, Scheduler):
        raise SchedulerError(f"scheduler {kind!r} built {type(scheduler).__name__}, which is not a Scheduler")
    return scheduler


def make_job_backend(kind: str, **kwargs: Any) -> JobBackend:
    """The detached-job backend of scheduler ``kind``; ``kwargs`` go to its constructor."""
    check_scheduler(kind)
    if kind not in JOB_BACKENDS:
        raise SchedulerError(f"scheduler {kind!r} has no job backend registered; it cannot run detached jobs")
    backend = JOB_BACKENDS.build(kind, **kwargs)
    if not isinstance(backend, JobBackend):
        raise SchedulerError(f"job backend {kind!r} built {type(backend).__name__}, which is not a JobBackend")
    return backend


def _class_method(cls: type, kind: str, what: str, name: str) -> Any:
    method = getattr(cls, name, None)
    if method is None:
        raise SchedulerError(f"{what} {kind!r} ({cls.__name__}) has no {name}(cfg); add it (see launch/registry.py)")
    return method


def job_backend_for(cfg: JobConfig) -> JobBackend:
    """The detached-job backend of ``cfg.cluster.scheduler``, built from the job's config (its ``from_config``)."""
    kind = cfg.cluster.scheduler
    check_scheduler(kind)
    if kind not in JOB_BACKENDS:
        raise SchedulerError(f"scheduler {kind!r} has no job backend registered; it cannot run detached jobs")
    backend = _class_method(JOB_BACKENDS.get(kind), kind, "job backend", "from_config")(cfg)
    if not isinstance(backend, JobBackend):
        raise SchedulerError(f"job backend {kind!r} built {type(backend).__name__}, which is not a JobBackend")
    return backend


def runs_here(cfg: JobConfig) -> bool:
    """Whether this process may run the job's controller itself (``can_run_controller_here`` of the
    kind's scheduler class): always for ``local``; inside the cluster for the others. When False,
    ``areal train`` submits itself as a detached job and follows it."""
    kind = cfg.cluster.scheduler
    check_scheduler(kind)
    return bool(_class_method(SCHEDULERS.get(kind), kind, "scheduler", "can_run_controller_here")(cfg))


def preflight_for(cfg: JobConfig) -> dict[str, Any]:
    """The live checks of ``cfg.cluster.scheduler`` before anything starts (the scheduler class's
    ``preflight``): a small report, or SchedulerError naming what is short."""
    kind = cfg.cluster.scheduler
    check_scheduler(kind)
    report = _class_method(SCHEDULERS.get(kind), kind, "scheduler", "preflight")(cfg)
    return dict(report)
