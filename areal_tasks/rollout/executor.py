"""The asynchronous rollout executor: episodes on a background event loop, batches for a synchronous trainer.

:class:`RolloutExecutor` owns one asyncio event loop in a daemon thread. On it, groups of
``group_size`` episodes (``workflow.arun_episode(engine, item)`` with the same dataset item) run
concurrently, admitted under the bounded-staleness rule of :mod:`areal_tasks.rollout.staleness`;
finished groups are rejected (an episode returned None, raised or was invalid), filtered (the
``group_filter`` hook said False) or queued as ready. The trainer thread calls the thread-safe
methods: :meth:`~RolloutExecutor.prepare_batch` blocks until ``batch_size`` samples of whole groups
can be returned: with ``staleness_bound="sample"`` (the default) without breaking any group's
staleness deadline, with ``"admission"`` the first finished groups (eta then bounds admission only,
and samples consumed past their deadline are counted in ``late_samples``); :meth:`~RolloutExecutor.pause`,
:meth:`~RolloutExecutor.update_weights`, :meth:`~RolloutExecutor.resume` and
:meth:`~RolloutExecutor.set_version` bracket a weight update, or :meth:`~RolloutExecutor.swap_weights`
does it in one call, sent from a control loop of its own (``control_loop.py``) so that it does not
queue behind the episodes. Too many failed episodes fail the
executor, and the next ``prepare_batch`` raises :class:`~areal_tasks.errors.RolloutError` with the
cause chained. See ``docs/rollout.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.errors import ConfigError, RolloutError, TrajectoryError
from areal_tasks.rollout.control_loop import ControlLoop, prompt_thread_switches
from areal_tasks.rollout.data_source import DataSource, Position
from areal_tasks.rollout.staleness import STALENESS_BOUNDS, AdmissionRule, StalenessBound, select_batch
from areal_tasks.rollout.stats import RolloutCounters, StalenessHistogram, batch_stats, staleness_of

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine, ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.config.rollout import RolloutConfig

logger = logging.getLogger(__name__)

__all__ = ["GroupFilter", "RolloutExecutor"]

#: DAPO's dynamic filter: gets the group's trajectories, False drops the whole group.
GroupFilter = Callable[[list[Trajectory]], bool]
T = TypeVar("T")

STATE_FORMAT = 1
#: at most one failure traceback per this many seconds (the others are counted).
_LOG_INTERVAL_S = 10.0
#: how long stop() waits for the loop to cancel its episodes and for the thread to end.
_STOP_TIMEOUT_S = 30.0
#: extra seconds prepare_batch waits for the loop itself beyond ``timeout_s`` before calling it unresponsive.
_LOOP_GRACE_S = 60.0


@dataclass(eq=False)
class _Group:
    """One admitted prompt and its ``size`` episodes."""

    seq: int
    position: Position
    item: Any
    admit_version: int
    deadline: int
    size: int
    trajs: list[Trajectory | None]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    done: int = 0
    resolved: bool = False


class RolloutExecutor:
    """Generates training batches of ``batch_size`` samples with bounded staleness (see module docstring).

    Lifecycle: build, optionally :meth:`load_state_dict`, :meth:`start`, then per training step
    :meth:`prepare_batch`, train, ``pause() / update_weights(meta) / resume()`` and
    :meth:`set_version`; finally :meth:`stop` (or use the executor as a context manager).
    ``pause``, ``update_weights`` and ``resume`` also work before ``start`` (they run on the
    executor's loop in the calling thread); a pause before ``start`` makes the executor start paused.
    """

    def __init__(
        self,
        *,
        engine: InferenceEngine,
        workflow: RolloutWorkflow,
        dataset: Sequence[Any],
        batch_size: int,
        group_size: int,
        max_concurrent_rollouts: int,
        max_head_offpolicyness: int,
        max_failure_rate: float,
        failure_window: int = 64,
        seed: int,
        shuffle: bool = True,
        group_filter: GroupFilter | None = None,
        version: int = 0,
        staleness_bound: StalenessBound = "sample",
    ) -> None:
        _check_settings(
            batch_size,
            group_size,
            max_concurrent_rollouts,
            max_head_offpolicyness,
            max_failure_rate,
            failure_window,
            version,
            staleness_bound,
        )
        self._engine = engine
        self._workflow = workflow
        self._data = DataSource(dataset, seed=seed, shuffle=shuffle)
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_head_offpolicyness = max_head_offpolicyness
        #: what ``max_head_offpolicyness`` bounds: every returned sample, or admission only.
        self.staleness_bound: StalenessBound = staleness_bound
        self._rule = AdmissionRule(batch_size, group_size, max_concurrent_rollouts, max_head_offpolicyness)
        self._groups_per_batch = batch_size // group_size
        self._max_failure_rate = float(max_failure_rate)
        #: the failure rate is fatal only once this many episodes of the window have finished.
        self.min_finished_for_failure = max(1, math.ceil(failure_window / 4))
        self._window: deque[bool] = deque(maxlen=failure_window)
        self._group_filter = group_filter
        self._version = version
        self._base_version = version
        self._counters = RolloutCounters()
        self._hist = StalenessHistogram()
        # state owned by the event loop (or by the caller while no loop thread runs)
        self._running: dict[int, _Group] = {}
        self._ready: list[_Group] = []
        self._episodes: set[asyncio.Task[None]] = set()
        self._calls: set[asyncio.Task[Any]] = set()
        self._next_seq = 0
        self._paused = False
        self._stopped = False
        self._error: RolloutError | None = None
        self._last_exc: BaseException | None = None
        self._event: asyncio.Event | None = None
        self._last_batch: dict[str, float] = {}
        self._late_batches = 0
        self._log_last = -math.inf
        self._log_suppressed = 0
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._accepted_at_start = 0
        # lifecycle, guarded by _lock: "new" -> "running" -> "stopped"
        self._lock = threading.Lock()
        self._state = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        #: the loop weight swaps run on while the executor runs (made at the first such swap).
        self._control: ControlLoop | None = None

    @classmethod
    def from_config(
        cls,
        rollout_cfg: RolloutConfig,
        *,
        engine: InferenceEngine,
        workflow: RolloutWorkflow,
        dataset: Sequence[Any],
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        group_filter: GroupFilter | None = None,
        version: int = 0,
    ) -> RolloutExecutor:
        """An executor with the group size, concurrency, staleness (bound) and failure rate of a ``rollout`` section."""
        return cls(
            engine=engine,
            workflow=workflow,
            dataset=dataset,
            batch_size=batch_size,
            group_size=rollout_cfg.group_size,
            max_concurrent_rollouts=rollout_cfg.max_concurrent_rollouts,
            max_head_offpolicyness=rollout_cfg.max_head_offpolicyness,
            max_failure_rate=rollout_cfg.max_failure_rate,
            seed=seed,
            shuffle=shuffle,
            group_filter=group_filter,
            version=version,
            staleness_bound=rollout_cfg.staleness_bound,
        )

    # ------------------------------------------------------------------ lifecycle (any thread)

    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop` while the loop thread is alive."""
        return self._state == "running" and self._thread is not None and self._thread.is_alive()

    def start(self) -> RolloutExecutor:
        """Start the event loop thread and begin admitting groups (unless paused). Idempotent."""
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise RolloutError("this rollout executor was stopped and cannot be restarted; build a new one")
            loop = self._ensure_loop()
            self._thread = threading.Thread(
                target=self._thread_main, args=(loop,), daemon=True, name=f"rollout-executor-{id(self):x}"
            )
            self._started_at = time.monotonic()
            self._accepted_at_start = self._counters.accepted
            self._state = "running"
            self._thread.start()
        logger.info(
            "rollout executor started: batch %d = %d groups of %d, max %d in flight, eta %d (bounds %s), version %d%s",
            self.batch_size,
            self._groups_per_batch,
            self.group_size,
            self._rule.max_concurrent,
            self.max_head_offpolicyness,
            self.staleness_bound,
            self._version,
            " (paused)" if self._paused else "",
        )
        self._call(self._admit)
        return self

    def stop(self) -> None:
        """Cancel in-flight episodes, close the engine's connections of this loop, stop the thread. Idempotent."""
        with self._lock:
            if self._state == "stopped":
                return
            if self._thread is not None and threading.current_thread() is self._thread:
                raise RolloutError("stop() cannot be called from the executor's own event loop (a workflow or filter)")
            loop, thread = self._loop, self._thread
            try:
                if self._state == "running" and loop is not None and thread is not None:
                    fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
                    try:
                        fut.result(_STOP_TIMEOUT_S)
                    except Exception as exc:  # noqa: BLE001 - stopping must go on
                        logger.warning("rollout executor did not shut down cleanly: %r", exc)
                    loop.call_soon_threadsafe(loop.stop)
                    thread.join(_STOP_TIMEOUT_S)
                    if thread.is_alive():
                        logger.warning(
                            "rollout executor thread did not end within %.0f s (a workflow blocks the event "
                            "loop?); it is a daemon thread and dies with the process",
                            _STOP_TIMEOUT_S,
                        )
                elif loop is not None:  # never started, but engine calls ran on the loop
                    loop.run_until_complete(self._shutdown())
                if self._control is not None:
                    self._control.close(self._engine.aclose)
            finally:
                self._stopped = True
                self._stopped_at = time.monotonic()
                self._state = "stopped"
                if loop is not None and not loop.is_running():
                    loop.close()
        logger.info("rollout executor stopped: %s", self._counters.to_dict())

    def __enter__(self) -> RolloutExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ trainer-facing API (any thread)

    def prepare_batch(self, timeout_s: float | None = None) -> list[Trajectory]:
        """Block until ``batch_size`` samples are ready, then return and remove them from the ready queue.

        Groups are whole and contiguous (``group_size`` samples of one prompt in a row), ordered by
        staleness deadline, then completion (with ``staleness_bound="admission"``: by completion only,
        never waiting for a running group). Raises :class:`RolloutError` when the executor failed
        (the cause chained), was stopped, or ``timeout_s`` passed (the message names the counters).
        """
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s={timeout_s!r} must be > 0 or None")
        grace = None if timeout_s is None else timeout_s + _LOOP_GRACE_S
        return self._run(self._aprepare_batch, timeout_s, timeout=grace, before_start=False)

    def last_batch_stats(self) -> dict[str, float]:
        """Numbers about the last batch :meth:`prepare_batch` returned (empty before the first)."""
        return dict(self._last_batch)

    def pause(self, mode: PauseMode = "abort") -> None:
        """Stop admitting groups, then pause the engine (``abort``: in-flight requests resume later)."""
        self._run(self._apause, mode)

    def resume(self) -> None:
        """Resume the engine, then admit groups again."""
        self._run(self._aresume)

    def update_weights(self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None) -> None:
        """Run ``engine.update_weights(meta, buckets)`` on the executor's loop and wait for it.

        For a collective update call this from a helper thread while the trainer broadcasts.
        """
        self._run(self._engine.update_weights, meta, buckets)

    def swap_weights(
        self,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        version: int,
        mode: PauseMode = "abort",
    ) -> dict[str, float]:
        """A whole weight update in one call: admission stops, the engine's ``swap_weights`` pauses
        the servers in ``mode``, loads and resumes them (one request per server where the backend
        has one), then :meth:`set_version` and admission again. Returns the seconds of each part:
        ``queue`` (the call waiting for the executor's event loop, busy with the episodes in
        flight: the servers still generate meanwhile), ``pause``, ``transfer``, ``resume``.

        One call instead of four saves three round trips to a rollout side in another process,
        all inside the servers' pause. For a collective update call it from a helper thread while
        the trainer broadcasts: the servers receive only once they are paused.

        While the executor runs, and the engine allows it (``control_from_any_loop``), the swap's
        requests go out from a control loop of its own (:mod:`areal_tasks.rollout.control_loop`),
        not from the episodes' loop: it starts at once and reads the servers' answers as they
        come, however busy the episodes keep their loop. The new version and admission then
        reach the episodes' loop in order, before any later call to the executor.
        """
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ConfigError(f"version={version!r} must be an int >= 0")
        submitted = time.perf_counter()
        control = self._control_loop()
        if control is None:
            return self._run(self._aswap, meta, buckets, version, mode, submitted)
        loop = self._loop
        assert loop is not None
        self._paused = True  # a flag the loop's admission reads: no admission until the version is set
        with prompt_thread_switches():
            parts = control.run(self._timed_swap, meta, buckets, mode, submitted)
        try:
            loop.call_soon_threadsafe(self._swapped, version)
        except RuntimeError:  # the loop is closed
            raise RolloutError(
                f"the rollout executor was stopped while the weight swap to version {version} ran; "
                "the servers hold the new weights, the executor admits nothing more"
            ) from None
        return parts

    def destroy_weight_groups(self) -> list[str]:
        """Make the servers leave the collective weight-update groups the engine joined; returns their names.

        A passthrough to the engine's ``destroy_weight_groups()`` (``RemoteInferenceEngine``; an
        engine without one has no groups: returns ``[]``). Call it while the trainer destroys its
        side of the group. Works in every state: on the executor's loop while it runs, else on a
        fresh event loop in the calling thread (the RL loop tears the group down after
        :meth:`stop`, once the final evaluation is done); that loop's connections are closed after.
        """
        destroy: Callable[[], Coroutine[Any, Any, list[str]]] | None = getattr(
            self._engine, "destroy_weight_groups", None
        )
        if destroy is None:
            return []
        if self._state != "stopped":
            return self._run(destroy)

        async def on_own_loop() -> list[str]:
            try:
                return await destroy()
            finally:
                await self._engine.aclose()

        return asyncio.run(on_own_loop())

    def set_version(self, version: int) -> None:
        """Record the trainer's new version (after its weight update); raises the admission budget.

        The engine's own version is set by its ``update_weights``; this does not touch it.
        """
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ConfigError(f"version={version!r} must be an int >= 0")
        self._call(self._set_version, version)

    def stats(self) -> dict[str, Any]:
        """Counters (``late_samples`` among them), rates, in-flight/ready/capacity, the staleness bound, the
        staleness histogram and the last batch's staleness."""
        return self._call(self._stats)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: data position (plus unconsumed prompts to replay), counters, version."""
        return self._call(self._state_dict)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; only before :meth:`start`."""
        with self._lock:
            if self._state != "new":
                raise RolloutError(f"load_state_dict() must be called before start() (the executor is {self._state})")
            if state.get("format") != STATE_FORMAT:
                got = state.get("format")
                raise RolloutError(f"rollout executor state has format {got!r}, expected {STATE_FORMAT}")
            self._data.load_state_dict(state["data"])
            self._counters = RolloutCounters.from_dict(state.get("counters", {}))
            self._version = int(state["version"])
            self._base_version = int(state.get("base_version", self._version - self._counters.consumed_batches))
            self._hist.load_state(state.get("staleness_hist", {}))
            pending = len(state["data"].get("pending", []))
        logger.info(
            "rollout executor resumes at version %d, data epoch %d index %d, %d prompts to replay",
            self._version,
            self._data.epoch,
            self._data.index,
            pending,
        )

    # ------------------------------------------------------------------ running things on the loop

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    @staticmethod
    def _thread_main(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def _on_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the loop (or directly while no loop thread runs) and return its result."""
        if self._on_loop_thread():
            return fn(*args)
        with self._lock:
            if self._state != "running" or self._loop is None:
                return fn(*args)

            async def call() -> T:
                return fn(*args)

            fut = asyncio.run_coroutine_threadsafe(call(), self._loop)
        return self._wait(fut, None)

    def _run(
        self,
        coro_fn: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        timeout: float | None = None,
        before_start: bool = True,
    ) -> T:
        """Run a coroutine on the loop and wait for it; before start() it runs on the loop in this thread."""
        if self._on_loop_thread():
            raise RolloutError("this executor method blocks; it cannot be called from the executor's own event loop")
        with self._lock:
            if self._state == "stopped":
                raise RolloutError("the rollout executor is stopped")
            if self._state == "new":
                if not before_start:
                    raise RolloutError("call start() on the rollout executor before prepare_batch()")
                return self._ensure_loop().run_until_complete(coro_fn(*args))
            assert self._loop is not None
            fut = asyncio.run_coroutine_threadsafe(self._tracked(coro_fn(*args)), self._loop)
        return self._wait(fut, timeout)

    async def _tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coro
        finally:
            self._calls.discard(task)

    @staticmethod
    def _wait(fut: concurrent.futures.Future[T], timeout: float | None) -> T:
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            raise RolloutError("the rollout executor was stopped while this call was waiting") from None
        except concurrent.futures.TimeoutError:
            if fut.done():
                raise
            fut.cancel()
            raise RolloutError(
                f"the rollout executor's event loop did not answer within {timeout:.0f} s: something blocks it "
                "(a workflow or reward doing blocking work must use run_in_executor or a process pool)"
            ) from None
        except BaseException:
            fut.cancel()
            raise

    def _notify(self) -> None:
        """Wake whoever waits for a change (prepare_batch)."""
        if self._event is not None:
            self._event.set()
            self._event = None

    # ------------------------------------------------------------------ loop side: admission and episodes

    def _counts(self) -> dict[str, int]:
        return {
            "version": self._version,
            "base_version": self._base_version,
            "consumed": self._counters.consumed_samples,
            "ready": len(self._ready) * self.group_size,
            "running": len(self._running) * self.group_size,
            "in_flight": sum(g.size - g.done for g in self._running.values()),
        }

    def _admit(self) -> None:
        """Start groups while the admission rule allows (loop thread)."""
        if self._state != "running" or self._paused or self._stopped or self._error is not None:
            return
        try:
            while self._rule.may_admit(**self._counts()):
                position, item = self._data.next()
                group = _Group(
                    seq=self._next_seq,
                    position=position,
                    item=item,
                    admit_version=self._version,
                    deadline=self._version + self.max_head_offpolicyness,
                    size=self.group_size,
                    trajs=[None] * self.group_size,
                )
                self._next_seq += 1
                self._running[group.seq] = group
                self._counters.admitted += group.size
                loop = asyncio.get_running_loop()
                for i in range(group.size):
                    task = loop.create_task(self._run_episode(group, i), name=f"rollout-episode-{group.seq}-{i}")
                    group.tasks.append(task)
                    self._episodes.add(task)
                    task.add_done_callback(self._episodes.discard)
        except Exception as exc:  # noqa: BLE001 - a dataset that cannot be read fails the executor
            self._fail(RolloutError(f"could not start the next rollout group: {type(exc).__name__}: {exc}"), exc)

    async def _run_episode(self, group: _Group, i: int) -> None:
        try:
            traj = await self._workflow.arun_episode(self._engine, group.item)
            if traj is not None:
                if not isinstance(traj, Trajectory):
                    raise TrajectoryError(
                        f"{type(self._workflow).__name__}.arun_episode returned "
                        f"{type(traj).__name__}; expected a Trajectory or None"
                    )
                traj.validate()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed episode is counted, not fatal by itself
            self._episode_done(group, i, None, exc)
            return
        self._episode_done(group, i, traj, None)

    def _episode_done(self, group: _Group, i: int, traj: Trajectory | None, exc: Exception | None) -> None:
        try:
            self._on_episode(group, i, traj, exc)
        except Exception as bug:
            logger.exception("rollout executor internal error")
            self._fail(RolloutError(f"the rollout executor hit an internal error: {type(bug).__name__}: {bug}"), bug)

    def _on_episode(self, group: _Group, i: int, traj: Trajectory | None, exc: Exception | None) -> None:
        if group.resolved or self._stopped or self._error is not None:
            return
        group.done += 1
        self._window.append(exc is not None)
        if exc is not None:
            self._counters.failed += 1
            self._last_exc = exc
            self._log_failure(group, exc)
        if traj is None:
            self._resolve(group, "rejected")
        else:
            traj.metadata["rollout_admit_version"] = group.admit_version
            traj.metadata["rollout_group"] = group.seq
            group.trajs[i] = traj
            if group.done == group.size:
                self._finish(group)
        if exc is not None and self._failure_rate_exceeded():
            return
        self._notify()
        self._admit()

    def _finish(self, group: _Group) -> None:
        """All episodes returned a Trajectory: filter, then queue."""
        if self._group_filter is not None:
            try:
                keep = bool(self._group_filter([t for t in group.trajs if t is not None]))
            except Exception as exc:  # noqa: BLE001 - a broken filter is a bug: fail loudly
                self._fail(RolloutError(f"group_filter raised {type(exc).__name__}: {exc}"), exc)
                return
            if not keep:
                self._resolve(group, "filtered")
                return
        self._resolve(group, "accepted")

    def _resolve(self, group: _Group, outcome: str) -> None:
        group.resolved = True
        self._running.pop(group.seq, None)
        current = asyncio.current_task()
        for task in group.tasks:
            if task is not current and not task.done():
                task.cancel()
        if outcome == "accepted":
            self._ready.append(group)
            self._counters.accepted += group.size
        elif outcome == "filtered":
            self._counters.filtered += group.size
        else:
            self._counters.rejected += group.size

    def _log_failure(self, group: _Group, exc: Exception) -> None:
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
            self._counters.failed,
            f", {suppressed} not logged" if suppressed else "",
            type(exc).__name__,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )

    def _failure_rate_exceeded(self) -> bool:
        n = len(self._window)
        failures = sum(self._window)
        if n < self.min_finished_for_failure or failures / n <= self._max_failure_rate:
            return False
        exc = self._last_exc
        self._fail(
            RolloutError(
                f"{failures} of the last {n} episodes failed; last error: {type(exc).__name__}: {exc}; "
                f"raise rollout.max_failure_rate (now {self._max_failure_rate}) or fix the workflow"
            ),
            exc,
        )
        return True

    def _fail(self, error: RolloutError, cause: BaseException | None) -> None:
        """Record the executor's failure, cancel everything in flight and wake the trainer."""
        if self._error is not None:
            return
        error.__cause__ = cause
        self._error = error
        logger.error("rollout executor failed: %s", error)
        current = asyncio.current_task()
        for group in self._running.values():
            group.resolved = True
            for task in group.tasks:
                if task is not current:
                    task.cancel()
        self._running.clear()
        self._notify()

    def _set_version(self, version: int) -> None:
        if version < self._version:
            logger.warning("rollout executor: trainer version goes back from %d to %d", self._version, version)
        self._version = version
        self._notify()
        self._admit()

    async def _apause(self, mode: PauseMode) -> None:
        self._paused = True
        await self._engine.pause(mode)

    async def _aswap(
        self,
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        version: int,
        mode: PauseMode,
        submitted: float,
    ) -> dict[str, float]:
        self._paused = True  # no admission until the new version is set
        parts = await self._timed_swap(meta, buckets, mode, submitted)
        self._swapped(version)
        return parts

    async def _timed_swap(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None, mode: PauseMode, submitted: float
    ) -> dict[str, float]:
        queued = time.perf_counter() - submitted
        return {"queue": queued, **await self._engine.swap_weights(meta, buckets, mode)}

    def _swapped(self, version: int) -> None:
        """Loop side, after a swap: the new version, then admission again."""
        self._set_version(version)
        self._reopen()

    def _control_loop(self) -> ControlLoop | None:
        """The loop for swaps while the executor runs and its engine allows it, else None."""
        if not getattr(self._engine, "control_from_any_loop", False) or self._on_loop_thread():
            return None
        with self._lock:
            if self._state != "running" or self._loop is None:
                return None
            if self._control is None:
                self._control = ControlLoop(f"rollout-control-{id(self):x}")
            return self._control

    async def _aresume(self) -> None:
        await self._engine.resume()
        self._reopen()

    def _reopen(self) -> None:
        """Admit again once the servers generate: on the loop's next turn, so the resume returns as
        soon as the servers run, not after the first steps of a batch's worth of new episodes
        (tokenising, building requests), which would count in the trainer's weight update (about
        100 ms for 64 on CPU)."""
        self._paused = False
        self._notify()
        asyncio.get_running_loop().call_soon(self._admit)

    async def _shutdown(self) -> None:
        self._stopped = True
        current = asyncio.current_task()
        for group in self._running.values():
            group.resolved = True
        self._running.clear()
        tasks = [t for t in (*self._episodes, *self._calls) if t is not current and not t.done()]
        for task in tasks:
            task.cancel()
        self._notify()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S / 2)
        try:
            await self._engine.aclose()
        except Exception as exc:  # noqa: BLE001 - closing connections must not stop the shutdown
            logger.warning("engine.aclose() failed while stopping the rollout executor: %r", exc)

    # ------------------------------------------------------------------ loop side: batches and state

    async def _aprepare_batch(self, timeout_s: float | None) -> list[Trajectory]:
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    self._raise_if_unusable()
                    if self._event is None:
                        self._event = asyncio.Event()
                    event = self._event
                    running = [g.deadline for g in self._running.values()]
                    groups, on_time = select_batch(
                        self._ready,
                        running,
                        version=self._version,
                        groups_per_batch=self._groups_per_batch,
                        bound=self.staleness_bound,
                    )
                    if groups is not None:
                        break
                    await event.wait()
        except TimeoutError:
            raise RolloutError(self._timeout_message(timeout_s)) from None
        taken = {id(g) for g in groups}
        self._ready = [g for g in self._ready if id(g) not in taken]
        batch = [t for g in groups for t in g.trajs if t is not None]
        version = self._version
        self._hist.add([s for s in (staleness_of(t, version) for t in batch) if s is not None])
        self._counters.consumed_samples += len(batch)
        self._counters.consumed_batches += 1
        late = sum(g.size for g in groups if version > g.deadline)
        self._counters.late_samples += late
        stats = batch_stats(batch, version=version, wait_s=time.monotonic() - started)
        stats["admit_staleness_max"] = float(max(version - g.admit_version for g in groups))
        stats["late_samples"] = float(late)
        self._last_batch = stats
        if not on_time:
            self._late_batches += 1
            logger.warning(
                "rollout batch at version %d leaves groups that will exceed max_head_offpolicyness=%d: the "
                "trainer version rose by more than one per batch",
                version,
                self.max_head_offpolicyness,
            )
        self._admit()
        return batch

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise RolloutError(str(self._error)) from self._error.__cause__
        if self._stopped:
            raise RolloutError("the rollout executor was stopped")

    def _capacity(self) -> tuple[int, int]:
        counts = self._counts()
        room = self._rule.staleness_room(
            version=counts["version"],
            base_version=counts["base_version"],
            consumed=counts["consumed"],
            ready=counts["ready"],
            running=counts["running"],
        )
        return room, self._rule.concurrency_room(counts["in_flight"])

    def _timeout_message(self, timeout_s: float | None) -> str:
        counts = self._counts()
        room, conc = self._capacity()
        capacity = max(0, min(room, conc))
        text = (
            f"prepare_batch timed out after {timeout_s:g} s waiting for {self.batch_size} samples: "
            f"in flight={counts['in_flight']} episodes, ready={counts['ready']} samples, "
            f"admitted={self._counters.admitted} samples so far, capacity={capacity} samples "
            f"(staleness budget room {room}, concurrency room {conc}); trainer version {self._version} "
            f"(base {self._base_version}), max_head_offpolicyness {self.max_head_offpolicyness}, "
            f"consumed {self._counters.consumed_batches} batches, paused={self._paused}"
        )
        if self._paused:
            text += "; the executor is paused: call resume()"
        elif room < self.group_size and counts["in_flight"] == 0:
            text += (
                "; the staleness budget is used up: call set_version() with the trainer's new version after "
                "each weight update (or raise rollout.max_head_offpolicyness)"
            )
        elif counts["in_flight"]:
            text += "; episodes are still generating: check the inference servers or raise timeout_s"
        return text

    def _stats(self) -> dict[str, Any]:
        c = self._counters
        counts = self._counts()
        room, conc = self._capacity()
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        elapsed = end - self._started_at if self._started_at is not None else 0.0
        finished = c.accepted + c.rejected + c.filtered
        window = len(self._window)
        return {
            **c.to_dict(),
            "in_flight": counts["in_flight"],
            "running_samples": counts["running"],
            "ready": counts["ready"],
            "capacity": max(0, min(room, conc)),
            "version": self._version,
            "base_version": self._base_version,
            "paused": self._paused,
            "staleness_bound": self.staleness_bound,
            "samples_per_s": (c.accepted - self._accepted_at_start) / elapsed if elapsed > 0 else 0.0,
            "rejection_rate": (c.rejected + c.filtered) / finished if finished else 0.0,
            "window_failure_rate": sum(self._window) / window if window else 0.0,
            "staleness_hist": self._hist.as_dict(),
            "last_batch_staleness_mean": self._last_batch.get("staleness_mean", 0.0),
            "last_batch_staleness_max": self._last_batch.get("staleness_max", 0.0),
            "late_batches": self._late_batches,
            "error": None if self._error is None else str(self._error),
        }

    def _state_dict(self) -> dict[str, Any]:
        pending = sorted([*self._running.values(), *self._ready], key=lambda g: g.seq)
        counters = RolloutCounters(**self._counters.to_dict())
        # unconsumed groups are replayed after a resume: count them as never admitted
        counters.admitted -= sum(g.size for g in pending)
        counters.accepted -= sum(g.size for g in self._ready)
        return {
            "format": STATE_FORMAT,
            "version": self._version,
            "base_version": self._base_version,
            "data": self._data.state_dict(g.position for g in pending),
            "counters": counters.to_dict(),
            "staleness_hist": self._hist.to_state(),
        }


def _check_settings(
    batch_size: int,
    group_size: int,
    max_concurrent: int,
    eta: int,
    max_failure_rate: float,
    failure_window: int,
    version: int,
    staleness_bound: str,
) -> None:
    def is_int(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    problems = []
    if not is_int(group_size) or group_size < 1:
        problems.append(f"group_size={group_size!r} must be an int >= 1")
    elif not is_int(batch_size) or batch_size < 1 or batch_size % group_size:
        problems.append(
            f"batch_size={batch_size!r} must be a positive multiple of group_size={group_size} "
            "(a batch holds whole groups)"
        )
    if is_int(group_size) and (not is_int(max_concurrent) or max_concurrent < group_size):
        problems.append(
            f"max_concurrent_rollouts={max_concurrent!r} must be >= group_size={group_size}: the "
            "episodes of a group run concurrently, so a whole group must fit (raise "
            "rollout.max_concurrent_rollouts)"
        )
    if not is_int(eta) or eta < 0:
        problems.append(f"max_head_offpolicyness={eta!r} must be an int >= 0 (0 = synchronous)")
    if staleness_bound not in STALENESS_BOUNDS:
        problems.append(
            f"staleness_bound={staleness_bound!r} must be one of "
            f"{', '.join(map(repr, STALENESS_BOUNDS))} (what max_head_offpolicyness bounds)"
        )
    if not isinstance(max_failure_rate, (int, float)) or not 0 <= max_failure_rate <= 1:
        problems.append(f"max_failure_rate={max_failure_rate!r} must be in [0, 1]")
    if not is_int(failure_window) or failure_window < 1:
        problems.append(f"failure_window={failure_window!r} must be an int >= 1")
    if not is_int(version) or version < 0:
        problems.append(f"version={version!r} must be an int >= 0")
    if problems:
        raise ConfigError("invalid rollout executor settings: " + "; ".join(problems))
