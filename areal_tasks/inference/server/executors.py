"""The server's own thread lanes for work that must not run on its event loop, each with a deadline.

Everything CPU-heavy or blocking that a request causes (tokenising a prompt, rendering a chat
template, reading or receiving weights, joining a weight-update group) runs on a lane of its own
instead of the event loop or asyncio's shared default executor. A lane has a fixed number of
threads, so one kind of work cannot starve another (hung group rendezvous cannot hold up a disk
weight load, nor either one tokenisation), and every call has a deadline: the caller gets
:class:`LaneTimeoutError` when it passes. A thread cannot be killed, so a call past its deadline
keeps its thread until it returns; the lane counts those (:meth:`Lanes.overdue`) so that ``/health``
can say the server is stuck, and :meth:`Lanes.busy` refuses new work on a lane whose threads are
all taken instead of queueing behind them.

Work that may queue (tokenising) passes ``wait_s``: the call waits at most that long for a thread
and is then dropped unrun (:class:`LaneBusyError`), and its deadline counts from the moment a thread
starts it, so time spent queued behind other requests never makes its own work look too slow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from areal_tasks.errors import InferenceError

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_LANES", "LaneBusyError", "LaneTimeoutError", "Lanes"]

T = TypeVar("T")

#: lane name -> threads: prompts and templates; weight loads and copies; group rendezvous/teardown.
DEFAULT_LANES: dict[str, int] = {"tokenize": 2, "weights": 1, "groups": 1}


class LaneTimeoutError(InferenceError):
    """A lane call passed its deadline (its thread may still be running)."""


class LaneBusyError(InferenceError):
    """Every thread of a lane is taken: the call was refused rather than queued, or it waited
    ``wait_s`` for a thread and was dropped without running."""


@dataclass
class _Call:
    what: str
    deadline: float
    #: when a thread started it (monotonic), None while it waits for one.
    started_at: float | None = None
    #: its caller gave up before a thread started it: the thread skips it.
    dropped: bool = False


class Lanes:
    """Named thread pools with deadlines (see the module docstring)."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self._sizes = dict(DEFAULT_LANES if sizes is None else sizes)
        self._pools = {
            name: concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"areal-{name}")
            for name, n in self._sizes.items()
        }
        self._running: dict[str, dict[int, _Call]] = {name: {} for name in self._sizes}
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False

    def busy(self, lane: str) -> bool:
        """Whether ``lane`` has as many calls in flight (running or waiting for a thread) as threads."""
        with self._lock:
            return len(self._running[self._check(lane)]) >= self._sizes[lane]

    def overdue(self) -> list[str]:
        """``"<lane>: <what> (<seconds> s past its deadline)"`` for every call still in flight past its deadline."""
        now = time.monotonic()
        with self._lock:
            return [
                f"{lane}: {call.what} ({now - call.deadline:.0f} s past its deadline)"
                for lane, calls in self._running.items()
                for call in calls.values()
                if now > call.deadline
            ]

    async def run(
        self,
        lane: str,
        fn: Callable[..., T],
        *args: Any,
        timeout_s: float,
        what: str = "",
        refuse_when_busy: bool = False,
        wait_s: float | None = None,
    ) -> T:
        """``fn(*args)`` on ``lane``'s threads, waited for at most ``timeout_s`` seconds.

        ``refuse_when_busy``: raise :class:`LaneBusyError` at once when the lane has as many calls in
        flight as threads (for work that must not queue, such as a second group rendezvous).

        ``wait_s``: the call may wait that long for a thread (then :class:`LaneBusyError`, and it never
        runs; so too when the caller is cancelled before a thread starts it), and ``timeout_s``
        counts from its start. Without it, ``timeout_s`` counts from now, waiting included.
        """
        if self._closed:
            raise InferenceError("the server is shutting down")
        what = what or getattr(fn, "__name__", "call")
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check(lane)
            if refuse_when_busy and len(self._running[lane]) >= self._sizes[lane]:
                raise LaneBusyError(
                    f"{lane} lane is busy ({len(self._running[lane])} call(s) running): try again later"
                )
            call_id = self._next_id
            self._next_id += 1
            now = time.monotonic()
            # a call that may queue has its deadline from its start: none while it waits (never overdue then)
            call = _Call(what, now + timeout_s if wait_s is None else math.inf)
            self._running[lane][call_id] = call
        started = asyncio.Event()

        def tracked() -> T | None:
            try:
                with self._lock:
                    if call.dropped:
                        return None
                    call.started_at = time.monotonic()
                    call.deadline = call.started_at + timeout_s
                with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
                    loop.call_soon_threadsafe(started.set)
                return fn(*args)
            finally:
                with self._lock:
                    self._running[lane].pop(call_id, None)

        future = loop.run_in_executor(self._pools[lane], tracked)
        remaining = timeout_s
        if wait_s is not None:
            remaining = await self._wait_for_start(future, started, call, wait_s, timeout_s, f"{lane} thread")
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(remaining, 0.0))  # type: ignore[return-value]
        except asyncio.TimeoutError:
            raise LaneTimeoutError(f"{what} did not finish within {timeout_s:g} s") from None

    async def _wait_for_start(
        self,
        future: asyncio.Future[Any],
        started: asyncio.Event,
        call: _Call,
        wait_s: float,
        timeout_s: float,
        thread: str,
    ) -> float:
        """Wait until a thread starts ``call`` (at most ``wait_s``); return the seconds left of its
        ``timeout_s``. A call not started by then, or whose caller is cancelled first, is dropped."""
        waiter = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({future, waiter}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            with self._lock:
                call.dropped = call.started_at is None
            raise
        finally:
            waiter.cancel()
        with self._lock:
            if call.started_at is None:
                call.dropped = True
                raise LaneBusyError(f"{call.what} waited {wait_s:g} s for a {thread}: try again later")
            return call.started_at + timeout_s - time.monotonic()

    def shutdown(self) -> None:
        """Refuse new calls and drop queued ones; running threads are left to finish (not joined)."""
        self._closed = True
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def _check(self, lane: str) -> str:
        if lane not in self._pools:
            raise InferenceError(f"unknown lane {lane!r}; lanes: {', '.join(sorted(self._pools))}")
        return lane
