"""A second event loop on the rollout side, for weight swaps, so a swap never queues behind episodes.

The rollout executor's event loop runs every episode in flight: tokenising, building requests,
parsing answers, scoring. With a few hundred episodes in flight (an asynchronous run, eta > 0) it is
busy most of the time, and a weight swap posted to it waited for its turn: on one H200, 35-230 ms
before the servers were even asked to pause, then up to 50 ms for the pause's answer to be read and
65 ms for the resume's, all while the trainer waited (the servers' pause itself took 11 ms).

:class:`ControlLoop` is a daemon thread with an event loop of its own that does nothing but such
control calls: the swap's requests go out the moment the trainer asks, and their answers are read
the moment they arrive. The engine must allow it (``InferenceEngine.control_from_any_loop``: the HTTP
client holds every loop's requests during a pause).

The two threads still share one interpreter lock. A thread that waits for it gets it when the
holder reaches the switch interval (5 ms by default), and a swap needs it a few times (the request
sent, each answer read). :func:`prompt_thread_switches` lowers the interval for the duration of a
swap only, so the control thread waits at most about half a millisecond each time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from areal_tasks.errors import RolloutError

logger = logging.getLogger(__name__)

__all__ = ["SWAP_SWITCH_INTERVAL_S", "ControlLoop", "prompt_thread_switches"]

T = TypeVar("T")

#: the interpreter's thread switch interval while a swap is in flight (seconds).
SWAP_SWITCH_INTERVAL_S = 0.0005
#: seconds :meth:`ControlLoop.close` waits for the loop's finaliser and for the thread to end.
_CLOSE_TIMEOUT_S = 15.0

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextlib.contextmanager
def prompt_thread_switches(interval_s: float = SWAP_SWITCH_INTERVAL_S) -> Iterator[None]:
    """Lower ``sys.setswitchinterval`` to at most ``interval_s`` inside the block (process-wide;
    nested and concurrent blocks share one saved value, restored when the last one leaves)."""
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, interval_s))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


class ControlLoop:
    """An event loop in a daemon thread that runs coroutines for callers in other threads."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, coro_fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run ``coro_fn(*args)`` on the loop and return its result (its exception is raised here;
        a call still running when the loop is closed raises RolloutError)."""
        self._refuse_own_thread("run")
        with self._lock:
            if self._closed:
                raise RolloutError(f"{self.name} is closed")
            future = asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RolloutError(f"{self.name} was closed while this call ran") from None

    def close(self, finalizer: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
        """Cancel the calls still running, run ``finalizer()`` on the loop (e.g. close its
        connections), then stop the loop and the thread (bounded; a finaliser that fails or hangs
        is logged). Idempotent."""
        self._refuse_own_thread("close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(finalizer), self._loop).result(_CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing goes on; the connections die with the loop
            logger.warning("%s: closing its connections failed: %r", self.name, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning(
                "%s did not stop within %.0f s; it is a daemon thread and dies with the process",
                self.name,
                _CLOSE_TIMEOUT_S,
            )
            return
        self._loop.close()

    async def _shutdown(self, finalizer: Callable[[], Coroutine[Any, Any, Any]] | None) -> None:
        current = asyncio.current_task()
        running = [task for task in asyncio.all_tasks() if task is not current]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=_CLOSE_TIMEOUT_S / 2)
        if finalizer is not None:
            await finalizer()

    def _refuse_own_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise RolloutError(f"{self.name}: {what}() would wait for its own event loop")
