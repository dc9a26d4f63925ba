"""GroupScheduler: what the local, Ray and SLURM schedulers do the same way with their worker groups.

Each of them keeps its groups by name in ``_groups``, under one re-entrant ``_lock``, and a record
per worker with its ``info``, ``ready_target`` and ``stop_requested``. On that, this class implements
:meth:`wait_ready` (a worker that was stopped or has failed raises at once; the others are probed
every ``readiness.interval_s`` until each is ready, STARTING becoming RUNNING, or the timeout
passes), :meth:`stop_group`, the look-up of a group by name, and the core of ``start_group``
(:meth:`_start_named`: refuse a name whose earlier group still runs, launch, stop what a failed launch
started, record the group).

A backend says how a worker's state is refreshed (a local process, an ``srun`` client, a supervisor
actor: :meth:`_refresh`), how a group is stopped (:meth:`_stop`), how a worker is probed
(:meth:`_probe`; from the controller unless overridden) and how its readiness, its failure and a
readiness timeout are put into words (:meth:`_announce_ready` logs under the backend's own logger).
"""

from __future__ import annotations

import copy
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from areal_tasks.api.scheduler import Scheduler, WorkerGroupSpec, WorkerInfo, WorkerStatus
from areal_tasks.errors import ReadinessTimeoutError, SchedulerError, WorkerFailedError
from areal_tasks.launch.readiness import ProbeResult, probe

__all__ = ["GroupRecord", "GroupScheduler", "GroupWorker"]


class GroupWorker(Protocol):
    """What :class:`GroupScheduler` reads of a backend's record of one worker."""

    info: WorkerInfo
    ready_target: str
    stop_requested: bool


W = TypeVar("W", bound=GroupWorker)
W_co = TypeVar("W_co", bound=GroupWorker, covariant=True)


class GroupRecord(Protocol[W_co]):
    """What :class:`GroupScheduler` reads of a backend's record of one group."""

    @property
    def spec(self) -> WorkerGroupSpec: ...

    @property
    def workers(self) -> Sequence[W_co]: ...


G = TypeVar("G", bound=GroupRecord[Any])


class GroupScheduler(Scheduler, Generic[G, W]):
    """A :class:`~areal_tasks.api.scheduler.Scheduler` whose groups are ``G`` records of ``W`` workers
    (see the module docstring for what a backend supplies)."""

    _groups: dict[str, G]
    _lock: threading.RLock

    # -- Scheduler API -------------------------------------------------------------------------

    def wait_ready(self, group: str, timeout_s: float | None = None) -> None:
        state = self._group(group)
        timeout = state.spec.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        last_probe: dict[int, str] = {}
        for worker in state.workers:
            if worker.stop_requested:
                raise SchedulerError(f"worker {worker.info.name} was stopped; start group {group!r} again")
            if self._refresh(worker) is WorkerStatus.FAILED:
                raise WorkerFailedError(self._failure_message(worker, "after it was started"))
        pending = [w for w in state.workers if w.info.status is WorkerStatus.STARTING]
        while pending:
            for worker in list(pending):
                if self._refresh(worker).is_terminal:
                    raise WorkerFailedError(self._failure_message(worker, "before becoming ready"))
                result = self._probe(state.spec, worker)
                if result.ready:
                    with self._lock:
                        if worker.info.status is WorkerStatus.STARTING:
                            worker.info.status = WorkerStatus.RUNNING
                    self._announce_ready(worker, result.detail)
                    pending.remove(worker)
                else:
                    last_probe[worker.info.rank] = result.detail
            if pending and time.monotonic() >= deadline:
                raise ReadinessTimeoutError(self._timeout_message(state.spec, pending, last_probe, timeout))
            if pending:
                time.sleep(state.spec.readiness.interval_s)

    def stop_group(self, group: str, grace_s: float = 10.0) -> None:
        self._stop([self._group(group)], grace_s)

    # -- shared steps --------------------------------------------------------------------------

    def _group(self, name: str) -> G:
        with self._lock:
            state = self._groups.get(name)
        if state is None:
            known = ", ".join(sorted(self._groups)) or "none"
            raise SchedulerError(f"unknown worker group {name!r} (known: {known}); start_group() it first")
        return state

    def _start_named(self, group: G, launch: Callable[[G], None]) -> list[WorkerInfo]:
        """Launch the new ``group`` and record it under its name; copies of its workers' info.

        All under the lock: SchedulerError while a worker of the earlier group of that name still runs;
        if ``launch`` raises (anything, an interrupt included), the half-started group is stopped
        (1 s grace) and the error goes on, the group unrecorded.
        """
        name = group.spec.name
        with self._lock:
            previous = self._groups.get(name)
            if previous is not None:
                running = [w.info.name for w in previous.workers if not self._refresh(w).is_terminal]
                if running:
                    raise SchedulerError(
                        f"group {name!r} is already running ({', '.join(running)}); "
                        "call stop_group() first or start the new group under another name"
                    )
            try:
                launch(group)
            except BaseException:
                self._stop([group], grace_s=1.0)
                raise
            self._groups[name] = group
        return [copy.deepcopy(w.info) for w in group.workers]

    def _probe(self, spec: WorkerGroupSpec, worker: W) -> ProbeResult:
        """One probe of ``worker``'s readiness target, from the controller."""
        return probe(spec.readiness.kind, worker.ready_target, spec.readiness.expect_status)

    # -- what a backend supplies ---------------------------------------------------------------

    @abstractmethod
    def _refresh(self, worker: W) -> WorkerStatus:
        """Record ``worker``'s exit (or loss) if it has ended; its (new) status."""

    @abstractmethod
    def _stop(self, groups: list[G], grace_s: float) -> None:
        """Stop every worker of ``groups``: gracefully, then forcefully after ``grace_s``."""

    @abstractmethod
    def _announce_ready(self, worker: W, detail: str) -> None:
        """Log that ``worker`` passed its readiness probe (``detail``: what the probe saw)."""

    @abstractmethod
    def _failure_message(self, worker: W, when: str) -> str:
        """The WorkerFailedError message of ``worker``, which failed ``when`` (e.g. "unexpectedly")."""

    @abstractmethod
    def _timeout_message(
        self, spec: WorkerGroupSpec, pending: list[W], last_probe: dict[int, str], timeout: float
    ) -> str:
        """The ReadinessTimeoutError message for the ``pending`` workers (last probe detail by rank)."""
