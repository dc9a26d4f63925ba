"""Group assembly on the rollout executor's event loop: admission, episodes, and each group's outcome.

:class:`GroupAssembly` owns the groups of one executor (the state lives on its event loop, so it
needs no lock). :meth:`~GroupAssembly.admit` starts groups while the bounded-staleness rule of
:mod:`areal_tasks.rollout.staleness` allows: one dataset item, ``group_size`` concurrent episodes
of it. When a group's episodes have finished it is resolved:

- an episode returned None, raised, or returned something that is not a valid ``Trajectory`` ->
  **rejected** (the first such episode decides; its unfinished siblings are cancelled). A raise or
  an invalid trajectory also counts as a **failed** episode (logged, at most one traceback per
  10 s);
- else the group filter (DAPO's dynamic sampling) returning False -> **filtered** (a filter that
  raises fails the executor: a bug, not noise);
- else **accepted**: queued as ready, every trajectory stamped with ``rollout_admit_version``,
  ``rollout_group`` and its episode (:mod:`~areal_tasks.rollout.episodes`: ``(epoch, dataset index,
  sample)``, the servers that answered, the resubmissions).

Each episode's workflow runs on an :class:`~areal_tasks.rollout.episodes.EpisodeEngine` over the
shared engine; with a ``seed_base`` (``rollout.sampling.seed_mode: per_sample``) it gives every
request a seed derived from the episode's identity.

With a :class:`~areal_tasks.trace.sessions.SessionRecorder` every episode gets a session record at
admission; its end and its group's outcome (with the reason: the workflow's note, the exception,
the filter) go to the recorder, which writes it once final (``docs/tracing.md``).

Rejected and filtered groups give their samples back to the admission budget. :class:`FailureWindow`
is the failure policy: once enough episodes of the recent window finished, a failed fraction above
``max_failure_rate`` fails the executor, which cancels everything in flight.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.errors import RolloutError, TrajectoryError
from areal_tasks.rollout.data_source import DataSource, Position
from areal_tasks.rollout.episodes import EPISODE_KEY, EpisodeEngine, EpisodeId
from areal_tasks.rollout.staleness import AdmissionRule
from areal_tasks.rollout.stats import RolloutCounters
from areal_tasks.trace.sessions import EpisodeSession, SessionRecorder, bind, filter_reason

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine
    from areal_tasks.api.rollout import GroupFilter
    from areal_tasks.rollout.stream_source import StreamingDataSource

logger = logging.getLogger(__name__)

__all__ = ["FailureWindow", "Group", "GroupAssembly"]

#: at most one failure traceback per this many seconds (the others are counted).
_LOG_INTERVAL_S = 10.0

#: makes an episode's task on the executor's loop: ``spawn(coroutine, name)``.
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


@dataclass(eq=False)
class Group:
    """One admitted prompt and its ``size`` episodes."""

    seq: int
    position: Position
    #: the item's index in the dataset (``position`` is its place in the epoch's order).
    data_index: int
    item: Any
    admit_version: int
    deadline: int
    size: int
    trajs: list[Trajectory | None]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: the episodes' session records (empty without a recorder).
    sessions: list[EpisodeSession | None] = field(default_factory=list)
    done: int = 0
    resolved: bool = False


class FailureWindow:
    """The outcomes (failed or not) of the last ``size`` finished episodes, and when they are too many."""

    def __init__(self, size: int, max_rate: float) -> None:
        self.outcomes: deque[bool] = deque(maxlen=size)
        self.max_rate = float(max_rate)
        #: the failure rate is fatal only once this many episodes of the window have finished.
        self.min_finished = max(1, math.ceil(size / 4))
        self.last_exc: BaseException | None = None
        self._log_last = -math.inf
        self._log_suppressed = 0

    def record(self, exc: Exception | None) -> None:
        """One finished episode: failed when ``exc`` is given."""
        self.outcomes.append(exc is not None)
        if exc is not None:
            self.last_exc = exc

    @property
    def rate(self) -> float:
        """Failed fraction of the window (0 when empty)."""
        return sum(self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    def exceeded(self) -> RolloutError | None:
        """The executor's failure when the window's failed fraction is too high, else None."""
        n = len(self.outcomes)
        failures = sum(self.outcomes)
        if n < self.min_finished or failures / n <= self.max_rate:
            return None
        exc = self.last_exc
        return RolloutError(
            f"{failures} of the last {n} episodes failed; last error: {type(exc).__name__}: {exc}; "
            f"raise rollout.max_failure_rate (now {self.max_rate}) or fix the workflow"
        )

    def log(self, group: Group, exc: Exception, n_failed: int) -> None:
        """Log a failed episode with its traceback, at most once per ``_LOG_INTERVAL_S``."""
        now = time.monotonic()
        if now - self._log_last < _LOG_INTERVAL_S:
            self._log_suppressed += 1
            return
        suppressed, self._log_suppressed, self._log_last = self._log_suppressed, 0, now
        logger.warning(
            "rollout episode failed (group %d, prompt at epoch %d index %d; %d failed so far%s): %s: %s",
            group.seq,
            group.position[0],
            group.position[1],
            n_failed,
            f", {suppressed} not logged" if suppressed else "",
            type(exc).__name__,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )


class GroupAssembly:
    """The groups of one executor, from admission to their outcome (loop thread; see the module docstring).

    ``version`` is the trainer's version (admission budget and deadlines), ``base_version`` the
    version the sample counters started at. Admission is open once ``started`` and while not
    ``paused``, ``stopped`` or failed (``error``). Whoever waits for a change (a batch) awaits
    :meth:`changed`.
    """

    def __init__(
        self,
        *,
        engine: InferenceEngine,
        workflow: RolloutWorkflow,
        data: DataSource | StreamingDataSource,
        rule: AdmissionRule,
        failures: FailureWindow,
        group_filter: GroupFilter | None,
        version: int,
        spawn: Spawn,
        seed_base: int | None = None,
        sessions: SessionRecorder | None = None,
    ) -> None:
        self.engine, self.workflow, self.data, self.rule = engine, workflow, data, rule
        #: the session trace (None: off).
        self.sessions = sessions
        #: per-sample seeds from this base (None: requests keep the workflow's sampling seed).
        self.seed_base = seed_base
        self.failures = failures
        self.group_filter = group_filter
        self.group_size = rule.group_size
        self.version = version
        self.base_version = version
        self.counters = RolloutCounters()
        self.running: dict[int, Group] = {}
        self.ready: list[Group] = []
        self.next_seq = 0
        self.started = False
        self.paused = False
        self.stopped = False
        self.error: RolloutError | None = None
        self._event: asyncio.Event | None = None
        self._spawn = spawn

    # ------------------------------------------------------------------ counts and waiting

    def counts(self) -> dict[str, int]:
        """What the admission rule looks at (samples, but ``in_flight`` episodes)."""
        return {
            "version": self.version,
            "base_version": self.base_version,
            "consumed": self.counters.consumed_samples,
            "ready": len(self.ready) * self.group_size,
            "running": len(self.running) * self.group_size,
            "in_flight": sum(g.size - g.done for g in self.running.values()),
        }

    def capacity(self) -> tuple[int, int]:
        """``(staleness budget room, concurrency room)`` in samples and episodes."""
        counts = self.counts()
        room = self.rule.staleness_room(
            version=counts["version"],
            base_version=counts["base_version"],
            consumed=counts["consumed"],
            ready=counts["ready"],
            running=counts["running"],
        )
        return room, self.rule.concurrency_room(counts["in_flight"])

    def changed(self) -> asyncio.Event:
        """An event set at the next change (a group resolved, a version, a failure, a stop)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def notify(self) -> None:
        """Wake whoever waits for a change."""
        if self._event is not None:
            self._event.set()
            self._event = None

    def raise_if_unusable(self) -> None:
        """The executor's failure (cause chained) or its stop, as a RolloutError."""
        if self.error is not None:
            raise RolloutError(str(self.error)) from self.error.__cause__
        if self.stopped:
            raise RolloutError("the rollout executor was stopped")

    # ------------------------------------------------------------------ admission and episodes

    def admit(self) -> None:
        """Start groups while the admission rule allows (loop thread)."""
        if not self.started or self.paused or self.stopped or self.error is not None:
            return
        try:
            while self.rule.may_admit(**self.counts()):
                position, item = self.data.next()
                group = Group(
                    seq=self.next_seq,
                    position=position,
                    data_index=self.data.dataset_index(position),
                    item=item,
                    admit_version=self.version,
                    deadline=self.version + self.rule.eta,
                    size=self.group_size,
                    trajs=[None] * self.group_size,
                )
                self.next_seq += 1
                if self.sessions is not None:
                    group.sessions = self.sessions.open_group(
                        epoch=position[0],
                        data_index=group.data_index,
                        order=position[1],
                        size=group.size,
                        group_seq=group.seq,
                        version=self.version,
                    )
                self.running[group.seq] = group
                self.counters.admitted += group.size
                for i in range(group.size):
                    group.tasks.append(self._spawn(self._run_episode(group, i), f"rollout-episode-{group.seq}-{i}"))
        except Exception as exc:  # noqa: BLE001 - a dataset that cannot be read fails the executor
            self.fail(RolloutError(f"could not start the next rollout group: {type(exc).__name__}: {exc}"), exc)

    def set_version(self, version: int) -> None:
        """The trainer's new version: raises the budget, then admits."""
        if version < self.version:
            logger.warning("rollout executor: trainer version goes back from %d to %d", self.version, version)
        self.version = version
        self.notify()
        self.admit()

    def reopen(self) -> None:
        """Admit again once the servers generate: on the loop's next turn, so a resume returns as
        soon as the servers run, not after the first steps of a batch's worth of new episodes
        (tokenising, building requests), which would count in the trainer's weight update."""
        self.paused = False
        self.notify()
        asyncio.get_running_loop().call_soon(self.admit)

    async def _run_episode(self, group: Group, i: int) -> None:
        episode = EpisodeEngine(self.engine, EpisodeId(group.position[0], group.data_index, i), self.seed_base)
        session = group.sessions[i] if group.sessions else None
        bind(session)  # this task's context: the reward timings and the workflow's notes reach it
        try:
            traj = await self.workflow.arun_episode(episode, group.item)
            if traj is not None:
                if not isinstance(traj, Trajectory):
                    raise TrajectoryError(
                        f"{type(self.workflow).__name__}.arun_episode returned "
                        f"{type(traj).__name__}; expected a Trajectory or None"
                    )
                traj.validate()
                traj.metadata[EPISODE_KEY] = episode.record()
        except asyncio.CancelledError:
            self._session_ended(session, episode, None)
            raise
        except Exception as exc:  # noqa: BLE001 - a failed episode is counted, not fatal by itself
            self._session_ended(session, episode, None)
            self._episode_done(group, i, None, exc)
            return
        self._session_ended(session, episode, traj)
        self._episode_done(group, i, traj, None)

    def _session_ended(self, session: EpisodeSession | None, episode: EpisodeEngine, traj: Trajectory | None) -> None:
        if session is not None and self.sessions is not None:
            self.sessions.ended(session, episode.calls, None if traj is None else traj.reward)

    def _episode_done(self, group: Group, i: int, traj: Trajectory | None, exc: Exception | None) -> None:
        try:
            self._on_episode(group, i, traj, exc)
        except Exception as bug:
            logger.exception("rollout executor internal error")
            self.fail(RolloutError(f"the rollout executor hit an internal error: {type(bug).__name__}: {bug}"), bug)

    def _on_episode(self, group: Group, i: int, traj: Trajectory | None, exc: Exception | None) -> None:
        if group.resolved or self.stopped or self.error is not None:
            return
        group.done += 1
        self.failures.record(exc)
        if exc is not None:
            self.counters.failed += 1
            self.failures.log(group, exc, self.counters.failed)
        if traj is None:
            self._reject(group, i, exc)
        else:
            traj.metadata["rollout_admit_version"] = group.admit_version
            traj.metadata["rollout_group"] = group.seq
            group.trajs[i] = traj
            if group.done == group.size:
                self._finish(group)
        if exc is not None:
            error = self.failures.exceeded()
            if error is not None:
                self.fail(error, self.failures.last_exc)
                return
        self.notify()
        self.admit()

    # ------------------------------------------------------------------ outcomes

    def _finish(self, group: Group) -> None:
        """All episodes returned a Trajectory: filter, then queue."""
        if self.group_filter is not None:
            try:
                keep = bool(self.group_filter([t for t in group.trajs if t is not None]))
            except Exception as exc:  # noqa: BLE001 - a broken filter is a bug: fail loudly
                self.fail(RolloutError(f"group_filter raised {type(exc).__name__}: {exc}"), exc)
                return
            if not keep:
                self._resolve(group, "filtered", filter_reason(self.group_filter, group.trajs))
                return
        self._resolve(group, "accepted")

    def _reject(self, group: Group, i: int, exc: Exception | None) -> None:
        """Episode ``i`` returned None or failed (``exc``): its group is rejected."""
        session = group.sessions[i] if group.sessions else None
        if exc is not None:
            why = f"{type(exc).__name__}: {exc}"
            status = "failed"
        else:
            why = (session.note if session is not None else None) or "the workflow returned None"
            status = "rejected"
        if self.sessions is not None:
            self.sessions.settle(session, status, why)
        self._resolve(group, "rejected", f"group rejected: sample {i} {status} ({why})")

    def _resolve(self, group: Group, outcome: str, reason: str | None = None) -> None:
        group.resolved = True
        self.running.pop(group.seq, None)
        current = asyncio.current_task()
        for task in group.tasks:
            if task is not current and not task.done():
                task.cancel()
        if self.sessions is not None:
            for session in group.sessions:
                self.sessions.settle(session, "accepted" if outcome == "accepted" else "rejected", reason)
        if outcome == "accepted":
            self.ready.append(group)
            self.counters.accepted += group.size
        elif outcome == "filtered":
            self.counters.filtered += group.size
        else:
            self.counters.rejected += group.size

    def fail(self, error: RolloutError, cause: BaseException | None) -> None:
        """Record the executor's failure, cancel everything in flight and wake the trainer."""
        if self.error is not None:
            return
        error.__cause__ = cause
        self.error = error
        logger.error("rollout executor failed: %s", error)
        current = asyncio.current_task()
        for group in self.running.values():
            group.resolved = True
            self._drop(group, f"the rollout executor failed: {error}")
            for task in group.tasks:
                if task is not current:
                    task.cancel()
        self.running.clear()
        self.notify()

    def stop(self) -> None:
        """No more admission or outcomes: the running groups are dropped (their episodes are
        cancelled by the loop's close) and every waiter wakes."""
        self.stopped = True
        for group in self.running.values():
            group.resolved = True
            self._drop(group, "still running when the rollout executor stopped")
        for group in self.ready:
            self._drop(group, "accepted, not taken by the trainer before the rollout executor stopped")
        self.running.clear()
        self.notify()

    def _drop(self, group: Group, reason: str) -> None:
        if self.sessions is not None:
            self.sessions.drop(group.sessions, reason)

    def take(self, groups: list[Group]) -> None:
        """Remove ``groups`` (a batch) from the ready queue."""
        taken = {id(g) for g in groups}
        self.ready = [g for g in self.ready if id(g) not in taken]
