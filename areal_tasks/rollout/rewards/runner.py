"""RewardRunner: score completions with a timeout, isolated in worker processes.

``RewardRunner(spec_or_fn, max_workers=2, timeout_s=15.0)`` runs the reward in up to
``max_workers`` worker processes (see :mod:`areal_tasks.rollout.rewards._pool`), so a reward that
hangs or crashes cannot stall or kill the caller: past ``timeout_s`` its worker is killed and
reaped, :class:`~areal_tasks.errors.RewardTimeoutError` is raised and the next call starts a fresh
worker. ``max_workers=0`` runs the reward in-process on a daemon thread: the timeout still raises,
but a hung function cannot be killed and keeps its thread. A reward that raises, returns a
non-number or a non-finite number gives :class:`~areal_tasks.errors.RewardError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import numbers
import threading
import time
from types import TracebackType
from typing import Any

from areal_tasks.errors import RewardError, RewardTimeoutError
from areal_tasks.rollout.rewards._pool import SendError, WorkerDied, WorkerPool, WorkerTimeout
from areal_tasks.rollout.rewards.registry import RewardFn, registered_name, resolve_reward
from areal_tasks.trace import span


def _in_daemon_thread(
    fn: RewardFn, completion: str, answer: str, kwargs: dict[str, Any]
) -> concurrent.futures.Future[tuple[bool, Any]]:
    """Run ``fn`` on a new daemon thread (a hung one never blocks interpreter exit).

    The future's result is ``(True, value)`` or ``(False, exception)``, so only the caller's own
    wait can time out (a reward raising TimeoutError is a failure, not a timeout).
    """
    future: concurrent.futures.Future[tuple[bool, Any]] = concurrent.futures.Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            outcome: tuple[bool, Any] = (True, fn(completion, answer, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome = (False, exc)
        future.set_result(outcome)

    threading.Thread(target=target, name="reward-in-process", daemon=True).start()
    return future


class RewardRunner:
    """Scores ``(completion, answer)`` pairs with one reward function, with a timeout and counters."""

    def __init__(
        self,
        fn_or_spec: str | RewardFn,
        *,
        max_workers: int = 2,
        timeout_s: float = 15.0,
        name: str | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(fn_or_spec, str):
            self.fn = resolve_reward(fn_or_spec)
            default_name = fn_or_spec.strip()
        elif callable(fn_or_spec):
            self.fn = fn_or_spec
            default_name = registered_name(fn_or_spec) or getattr(fn_or_spec, "__qualname__", repr(fn_or_spec))
        else:
            raise RewardError(f"a reward must be a spec string or a callable, got {type(fn_or_spec).__name__}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 0:
            raise RewardError(f"max_workers must be an integer >= 0 (0 = in-process), got {max_workers!r}")
        for label, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise RewardError(f"{label} must be a positive number of seconds, got {value!r}")
        self.name = name or default_name
        self.max_workers = max_workers
        self.timeout_s = float(timeout_s)
        self._pool = WorkerPool(self.fn, max_workers, start_timeout_s) if max_workers else None
        self._threads = (
            concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix=f"reward-{self.name}")
            if max_workers
            else None
        )
        self._lock = threading.Lock()
        self._counts = {"calls": 0, "failures": 0, "timeouts": 0}
        self._total_s = 0.0
        self._closed = False

    # -- scoring ---------------------------------------------------------------------------------

    async def score(self, completion: str, answer: str, **kwargs: Any) -> float:
        """The reward of ``completion`` against ``answer``; raises RewardError / RewardTimeoutError."""
        self._check_open()
        with span("reward", "reward", concurrent=True, reward=self.name):
            return await self._score(completion, answer, kwargs)

    async def _score(self, completion: str, answer: str, kwargs: dict[str, Any]) -> float:
        if self._threads is not None:
            future = self._threads.submit(self._score_in_worker, completion, answer, kwargs)
            return await asyncio.wrap_future(future)
        start = time.monotonic()
        future = asyncio.wrap_future(_in_daemon_thread(self.fn, completion, answer, kwargs))
        try:
            outcome = await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            raise self._timed_out(start, "") from None
        return self._in_process_result(start, outcome)

    def score_sync(self, completion: str, answer: str, **kwargs: Any) -> float:
        """Blocking :meth:`score` (call it from threads or code without an event loop)."""
        self._check_open()
        with span("reward", "reward", reward=self.name):
            if self._pool is not None:
                return self._score_in_worker(completion, answer, kwargs)
            start = time.monotonic()
            future = _in_daemon_thread(self.fn, completion, answer, kwargs)
            try:
                outcome = future.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                raise self._timed_out(start, "") from None
            return self._in_process_result(start, outcome)

    def _in_process_result(self, start: float, outcome: tuple[bool, Any]) -> float:
        ok, value = outcome
        if not ok:
            raise self._raised(start, type(value).__name__, str(value), "") from value
        return self._checked(start, value)

    def _score_in_worker(self, completion: str, answer: str, kwargs: dict[str, Any]) -> float:
        assert self._pool is not None
        start = time.monotonic()
        try:
            reply, pid = self._pool.run((completion, answer, kwargs), self.timeout_s)
        except WorkerTimeout:
            raise self._timed_out(start, " its worker process was killed and will be replaced;") from None
        except WorkerDied:
            detail = "the runner was closed" if self._closed else "its worker process died (crashed or was killed)"
            raise self._failed(start, f"reward {self.name!r} failed: {detail}") from None
        except SendError as exc:
            raise self._failed(start, f"reward {self.name!r}: {exc}") from exc
        if reply[0] == "error":
            raise self._raised(start, reply[1], reply[2], f"\nworker (pid {pid}) traceback:\n{reply[3]}")
        if reply[0] == "not_a_number":
            raise self._failed(start, f"reward {self.name!r} returned a {reply[1]} ({reply[2]}), not a number")
        return self._checked(start, reply[1])

    # -- results and counters --------------------------------------------------------------------

    def _checked(self, start: float, value: Any) -> float:
        if not isinstance(value, numbers.Real):
            shown = repr(value)[:200]
            raise self._failed(start, f"reward {self.name!r} returned a {type(value).__name__} ({shown}), not a number")
        result = float(value)
        if not math.isfinite(result):
            raise self._failed(start, f"reward {self.name!r} returned {result}, not a finite number")
        self._record(start)
        return result

    def _raised(self, start: float, kind: str, message: str, detail: str) -> RewardError:
        return self._failed(start, f"reward {self.name!r} raised {kind}: {message}{detail}")

    def _failed(self, start: float, message: str) -> RewardError:
        self._record(start, failed=True)
        return RewardError(message)

    def _timed_out(self, start: float, detail: str) -> RewardTimeoutError:
        self._record(start, failed=True, timed_out=True)
        where = "" if detail else " it keeps running in its in-process thread (max_workers=0);"
        return RewardTimeoutError(
            f"reward {self.name!r} did not finish within timeout_s={self.timeout_s:g} s;{detail}{where} "
            "if it is legitimately slow, raise RewardRunner(timeout_s=...)"
        )

    def _record(self, start: float, *, failed: bool = False, timed_out: bool = False) -> None:
        with self._lock:
            self._counts["calls"] += 1
            self._counts["failures"] += int(failed)
            self._counts["timeouts"] += int(timed_out)
            self._total_s += time.monotonic() - start

    def stats(self) -> dict[str, Any]:
        """Counters: ``calls`` (finished, any outcome), ``failures`` (incl. timeouts), ``timeouts``,
        ``total_s`` (seconds spent scoring), ``workers_started`` and the reward's ``name``."""
        with self._lock:
            stats: dict[str, Any] = {"name": self.name, **self._counts, "total_s": self._total_s}
        stats["workers_started"] = self._pool.started if self._pool is not None else 0
        return stats

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes (empty in-process)."""
        return self._pool.pids() if self._pool is not None else []

    # -- lifetime --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RewardError(f"reward runner {self.name!r} is closed")

    def close(self) -> None:
        """Stop the worker processes (a call still running fails); idempotent."""
        self._closed = True
        if self._pool is not None:
            self._pool.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = f"{self.max_workers} worker processes" if self.max_workers else "in-process"
        return f"RewardRunner({self.name!r}, {mode}, timeout_s={self.timeout_s:g})"
