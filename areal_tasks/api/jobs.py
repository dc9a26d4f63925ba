"""Detached, named jobs: the state a job backend reports and the interface every backend offers.

A *job* is one command (normally ``python -m areal_tasks.cli train ...``) that outlives the process
that submitted it: an Airflow task submits it, defers, and a later try (maybe in another worker
process, after a restart) finds it again by name. Each scheduler kind has one backend:

* ``local`` (:class:`areal_tasks.launch.jobs.LocalJobs`): a detached process group on this machine;
  ``JobStatus.pid`` is the wrapper's pid;
* ``ray``: a Ray Jobs API submission; ``job_id`` is its submission id;
* ``slurm``: an ``sbatch`` batch job; ``job_id`` is the SLURM job id.

Every backend names attempts the same way: each submission of a name is the next attempt (1, 2...),
and ``status(name)`` reports the newest. A submission is refused while the newest attempt runs.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["TERMINAL_STATES", "JobBackend", "JobState", "JobStatus"]

JobState = Literal["running", "succeeded", "failed", "cancelled", "missing"]
#: states after which a job never changes again.
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What is known about a job: its state, why, and where it runs.

    ``attempt`` counts submissions of the name (1 for the first; 0 when the job is missing).
    ``pid`` is set by process-based backends (the local wrapper's pid, also the job's process
    group id); ``job_id`` by cluster backends (a Ray submission id, a SLURM job id). ``backend``
    is the scheduler kind that reported the status.
    """

    name: str
    state: JobState
    reason: str
    run_dir: str | None = None
    exit_code: int | None = None
    pid: int | None = None
    attempt: int = 0
    log_path: str | None = None
    job_id: str | None = None
    backend: str = "local"

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (succeeded, failed or cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def handle(self) -> str:
        """How people refer to the job's current attempt: ``pid N`` or the backend's job id."""
        if self.job_id is not None:
            return f"{self.backend} job {self.job_id}"
        return f"pid {self.pid}" if self.pid is not None else "no process"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class JobBackend(Protocol):
    """Submit, look up, cancel and read the log of named jobs on one scheduler kind.

    Every method raises :class:`~areal_tasks.errors.SchedulerError` when the backend cannot be
    reached or refuses, with the backend's own message and what to do about it.
    """

    def submit(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        *,
        cwd: str | None = None,
    ) -> JobStatus:
        """Start ``argv`` as the next attempt of job ``name``; ``env`` reaches it without argv."""
        ...

    def status(self, name: str) -> JobStatus:
        """The state of the newest attempt of ``name`` (``missing`` when never submitted)."""
        ...

    def cancel(self, name: str, grace_s: float = 30.0) -> JobStatus:
        """Stop the job and everything it started: gracefully, then forcefully after ``grace_s``."""
        ...

    def log_tail(self, name: str, n: int = 40) -> str:
        """The last ``n`` lines of the newest attempt's log ('' when there is none)."""
        ...
