"""The asynchronous rollout executor: episodes on a background event loop, batches for a synchronous trainer.

:class:`RolloutExecutor` implements :class:`~areal_tasks.api.rollout.RolloutExecutorProtocol` with
one asyncio event loop in a daemon thread (a :class:`~areal_tasks.rollout.loop_thread.LoopThread`).
This module is the thread-safe surface the trainer calls and the executor's lifecycle; the work is
done by its parts, on that loop: groups admitted under the bounded-staleness rule, run and resolved
(:mod:`~areal_tasks.rollout.groups`), batches taken out of the ready groups
(:mod:`~areal_tasks.rollout.batches`), weight updates bracketed, a swap sent from a control loop of
its own so it does not queue behind the episodes (:mod:`~areal_tasks.rollout.swap`), statistics and
the checkpointable state (:mod:`~areal_tasks.rollout.state`).

:meth:`~RolloutExecutor.prepare_batch` blocks until ``batch_size`` samples of whole groups can be
returned; :meth:`~RolloutExecutor.pause`, :meth:`~RolloutExecutor.update_weights`,
:meth:`~RolloutExecutor.resume` and :meth:`~RolloutExecutor.set_version` bracket a weight update, or
:meth:`~RolloutExecutor.swap_weights` does it in one call. Too many failed episodes fail the
executor, and the next ``prepare_batch`` raises :class:`~areal_tasks.errors.RolloutError` with the
cause chained. See ``docs/rollout.md``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from areal_tasks.api.rollout import GroupFilter
from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.batches import BatchTaker
from areal_tasks.rollout.groups import FailureWindow, GroupAssembly
from areal_tasks.rollout.loop_thread import LoopThread
from areal_tasks.rollout.servers import ServerRoster
from areal_tasks.rollout.settings import check_executor_settings
from areal_tasks.rollout.staleness import AdmissionRule, StalenessBound
from areal_tasks.rollout.state import executor_state, executor_stats, load_executor_state
from areal_tasks.rollout.stream_source import data_source_for
from areal_tasks.rollout.swap import WeightSwap
from areal_tasks.trace.sessions import SessionRecorder

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine, ParamSpec, PauseMode
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.config.rollout import RolloutConfig
    from areal_tasks.datasets.stream import RecordStream

logger = logging.getLogger(__name__)

__all__ = ["RolloutExecutor"]

T = TypeVar("T")

#: how long stop() waits for the loop to cancel its episodes and for the thread to end.
_STOP_TIMEOUT_S = 30.0
#: extra seconds prepare_batch waits for the loop itself beyond ``timeout_s`` before calling it unresponsive.
_LOOP_GRACE_S = 60.0


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
        dataset: Sequence[Any] | RecordStream,
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
        seed_base: int | None = None,
        servers_file: str | os.PathLike[str] | None = None,
        sessions_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """``seed_base``: the deterministic mode (``rollout.sampling.seed_mode: per_sample``): each
        request's seed derives from it and the episode's identity, and batches come in data order.
        ``servers_file``: where the controller publishes the fleet's addresses after a restart
        (see :mod:`~areal_tasks.rollout.servers`). ``sessions_file``: where the session trace
        writes one line per final episode (:mod:`~areal_tasks.trace.sessions`; None: no trace)."""
        check_executor_settings(
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
        self._data = data_source_for(dataset, seed=seed, shuffle=shuffle)
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_head_offpolicyness = max_head_offpolicyness
        #: what ``max_head_offpolicyness`` bounds: every returned sample, or admission only.
        self.staleness_bound: StalenessBound = staleness_bound
        self._sessions = None if sessions_file is None else SessionRecorder(sessions_file)
        failures = FailureWindow(failure_window, max_failure_rate)
        #: the failure rate is fatal only once this many episodes of the window have finished.
        self.min_finished_for_failure = failures.min_finished
        # state owned by the event loop (or by the caller while no loop thread runs)
        self._groups = GroupAssembly(
            engine=engine,
            workflow=workflow,
            data=self._data,
            rule=AdmissionRule(batch_size, group_size, max_concurrent_rollouts, max_head_offpolicyness),
            failures=failures,
            group_filter=group_filter,
            version=version,
            spawn=lambda coro, name: self._ensure_loop().spawn(coro, name),
            seed_base=seed_base,
            sessions=self._sessions,
        )
        self._batches = BatchTaker(
            self._groups,
            batch_size=batch_size,
            eta=max_head_offpolicyness,
            bound=staleness_bound,
            data_order=seed_base is not None,
        )
        self._swap = WeightSwap(engine, self._groups, f"rollout-control-{id(self):x}", ServerRoster(servers_file))
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._accepted_at_start = 0
        # lifecycle, guarded by _lock: "new" -> "running" -> "stopped"
        self._lock = threading.Lock()
        self._state = "new"
        #: the episodes' loop (made at the first call that needs it, started by start()).
        self._loop: LoopThread | None = None

    @classmethod
    def from_config(
        cls,
        rollout_cfg: RolloutConfig,
        *,
        engine: InferenceEngine,
        workflow: RolloutWorkflow,
        dataset: Sequence[Any] | RecordStream,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        group_filter: GroupFilter | None = None,
        version: int = 0,
        servers_file: str | os.PathLike[str] | None = None,
        sessions_file: str | os.PathLike[str] | None = None,
    ) -> RolloutExecutor:
        """An executor with the group size, concurrency, staleness (bound), failure rate and seed mode of
        a ``rollout`` section (``per_sample`` seeds derive from ``rollout.sampling.seed``, else ``seed``)."""
        sampling = rollout_cfg.sampling
        seed_base = None
        if sampling.seed_mode == "per_sample":
            seed_base = sampling.seed if sampling.seed is not None else seed
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
            seed_base=seed_base,
            servers_file=servers_file,
            sessions_file=sessions_file,
        )

    # ------------------------------------------------------------------ lifecycle (any thread)

    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop` while the loop thread is alive."""
        return self._state == "running" and self._loop is not None and self._loop.running

    @property
    def _thread(self) -> threading.Thread | None:
        """The episodes' loop thread (None before :meth:`start`)."""
        return None if self._loop is None else self._loop.thread

    def start(self) -> RolloutExecutor:
        """Start the event loop thread and begin admitting groups (unless paused). Idempotent."""
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise RolloutError("this rollout executor was stopped and cannot be restarted; build a new one")
            self._started_at = time.monotonic()
            self._accepted_at_start = self._groups.counters.accepted
            self._state = "running"
            self._groups.started = True
            self._ensure_loop().start()
        logger.info(
            "rollout executor started: batch %d = %d groups of %d, max %d in flight, eta %d (bounds %s), version %d%s",
            self.batch_size,
            self._batches.groups_per_batch,
            self.group_size,
            self._groups.rule.max_concurrent,
            self.max_head_offpolicyness,
            self.staleness_bound,
            self._groups.version,
            " (paused)" if self._groups.paused else "",
        )
        self._call(self._groups.admit)
        return self

    def stop(self) -> None:
        """Cancel in-flight episodes, close the engine's connections of this loop, stop the thread. Idempotent."""
        with self._lock:
            if self._state == "stopped":
                return
            if self._loop is not None and self._loop.on_thread():
                raise RolloutError("stop() cannot be called from the executor's own event loop (a workflow or filter)")
            try:
                if self._loop is not None:  # never used: nothing ran on a loop, nothing to close
                    self._loop.close(self._close_engine, before=self._groups.stop)
                self._swap.close()
            finally:
                self._groups.stopped = True
                self._stopped_at = time.monotonic()
                self._state = "stopped"
                if self._sessions is not None:
                    self._sessions.close()
        logger.info("rollout executor stopped: %s", self._groups.counters.to_dict())

    def __enter__(self) -> RolloutExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _close_engine(self) -> None:
        try:
            await self._groups.workflow.aclose()
        except Exception as exc:  # noqa: BLE001 - a workflow's cleanup must not stop the shutdown
            logger.warning("workflow.aclose() failed while stopping the rollout executor: %r", exc)
        try:
            await self._engine.aclose()
        except Exception as exc:  # noqa: BLE001 - closing connections must not stop the shutdown
            logger.warning("engine.aclose() failed while stopping the rollout executor: %r", exc)

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
        return self._run(self._batches.take, timeout_s, timeout=grace, before_start=False)

    def last_batch_stats(self) -> dict[str, float]:
        """Numbers about the last batch :meth:`prepare_batch` returned (empty before the first)."""
        return dict(self._batches.last)

    def pause(self, mode: PauseMode = "abort") -> None:
        """Stop admitting groups, then pause the engine (``abort``: in-flight requests resume later)."""
        self._run(self._swap.pause, mode)

    def resume(self) -> None:
        """Resume the engine, then admit groups again."""
        self._run(self._swap.resume)

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
        episodes = self._episodes_loop_for_control()
        if episodes is None:
            return self._run(self._swap.swap, meta, buckets, version, mode, submitted)
        return self._swap.swap_from_control_loop(episodes, meta, buckets, version, mode, submitted)

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
        self._call(self._groups.set_version, version)

    def mark_trained(self, step: int) -> None:
        """The trainer trained the oldest batch :meth:`prepare_batch` returned (and not yet marked) at
        ``step``: the session trace writes its episodes as accepted and flushes. Runs in the calling
        thread (the recorder has its own lock), so it never waits for the busy event loop."""
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError(f"step={step!r} must be an int")
        if self._sessions is not None:
            self._sessions.trained(step)

    def stats(self) -> dict[str, Any]:
        """Counters (``late_samples`` among them), rates, in-flight/ready/capacity, the staleness bound, the
        staleness histogram and the last batch's staleness."""
        return self._call(self._stats)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: data position (plus unconsumed prompts to replay), counters, version."""
        return self._call(executor_state, self._groups, self._batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; only before :meth:`start`."""
        with self._lock:
            if self._state != "new":
                raise RolloutError(f"load_state_dict() must be called before start() (the executor is {self._state})")
            pending = load_executor_state(self._groups, self._batches, state)
        logger.info(
            "rollout executor resumes at version %d, data epoch %d index %d, %d prompts to replay",
            self._groups.version,
            self._data.epoch,
            self._data.index,
            pending,
        )

    def _stats(self) -> dict[str, Any]:
        return executor_stats(
            self._groups,
            self._batches,
            started_at=self._started_at,
            stopped_at=self._stopped_at,
            accepted_at_start=self._accepted_at_start,
        )

    def _episodes_loop_for_control(self) -> LoopThread | None:
        """The episodes' loop when a swap may go out from the control loop (the executor runs and its
        engine allows it), else None (the swap then runs on the episodes' loop)."""
        if not self._swap.may_use_control_loop or self._on_loop_thread():
            return None
        with self._lock:
            if self._state != "running" or self._loop is None:
                return None
            self._swap.control_loop()
            return self._loop

    # ------------------------------------------------------------------ running things on the loop

    def _ensure_loop(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread(
                f"rollout-executor-{id(self):x}",
                label="the rollout executor's event loop",
                close_timeout_s=_STOP_TIMEOUT_S,
                blocked_hint=" (a workflow or reward doing blocking work must use run_in_executor or a process pool)",
            )
        return self._loop

    def _on_loop_thread(self) -> bool:
        return self._loop is not None and self._loop.on_thread()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the loop (or directly while no loop thread runs) and return its result."""
        if self._on_loop_thread():
            return fn(*args)
        with self._lock:
            loop = self._loop
            if self._state != "running" or loop is None:
                return fn(*args)
        return loop.call(fn, *args)

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
            if self._state == "new" and not before_start:
                raise RolloutError("call start() on the rollout executor before prepare_batch()")
            loop = self._ensure_loop()
            if self._state == "new":
                return loop.run(coro_fn, *args)
            future = loop.submit(coro_fn(*args))
        return loop.wait(future, timeout)
