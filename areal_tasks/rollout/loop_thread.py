"""An asyncio event loop owned by one daemon thread, driven from other threads: the rollout side's bridge.

The rollout side runs coroutines (episodes, engine calls, weight swaps) for a caller that is
synchronous (the trainer): the rollout executor's episodes loop and the weight swaps' control loop
(:mod:`areal_tasks.rollout.control_loop`) are both a :class:`LoopThread`.

- :meth:`LoopThread.run` runs a coroutine on the loop and waits for its result (its exception is
  raised in the caller). Before :meth:`~LoopThread.start` it runs on the loop in the calling
  thread, so connections an engine opens then belong to the loop the thread uses later.
- :meth:`~LoopThread.call` runs a plain function on the loop (directly while no thread runs it),
  so state owned by the loop needs no lock.
- Every call sent through it, and every task :meth:`~LoopThread.spawn` made, is tracked:
  :meth:`~LoopThread.close` cancels those still running, runs a finaliser on the loop (close the
  engine's connections), stops the loop and joins the thread, each step bounded. A caller still
  waiting then gets a :class:`~areal_tasks.errors.RolloutError`, not a hang.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from areal_tasks.errors import RolloutError

logger = logging.getLogger(__name__)

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread named ``name`` (see the module docstring).

    ``label`` names it in errors (default: ``name``); ``close_timeout_s`` bounds :meth:`close`
    (half of it for the cancelled tasks to end); ``blocked_hint`` ends the message of a call that
    the loop did not answer in time (what to look for).
    """

    def __init__(
        self, name: str, *, label: str | None = None, close_timeout_s: float = 15.0, blocked_hint: str = ""
    ) -> None:
        self.name = name
        self.label = label or name
        self.close_timeout_s = close_timeout_s
        self.blocked_hint = blocked_hint
        self.loop = asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Run the loop in its thread from now on (idempotent)."""
        with self._lock:
            if self._closed:
                raise RolloutError(f"{self.label} is closed")
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def started(self) -> bool:
        """True once :meth:`start` ran (the loop then runs in its thread until closed)."""
        return self.thread is not None

    @property
    def running(self) -> bool:
        """True while the thread runs the loop."""
        return self.thread is not None and self.thread.is_alive() and not self._closed

    def on_thread(self) -> bool:
        """Whether the caller is the loop's own thread."""
        return self.thread is not None and threading.current_thread() is self.thread

    def close(
        self,
        finalizer: Callable[[], Coroutine[Any, Any, Any]] | None = None,
        *,
        before: Callable[[], None] | None = None,
    ) -> None:
        """On the loop: ``before()`` (e.g. refuse new work), cancel the tracked calls and tasks still
        running, then ``await finalizer()`` (e.g. close connections); then stop the loop and the
        thread. Bounded; a failing or hanging step is logged. Without a thread (never started) this
        runs on the loop in the calling thread. Idempotent."""
        self._refuse_own_thread("close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        shutdown = self._shutdown(before, finalizer)
        if self.thread is None:
            try:
                self.loop.run_until_complete(shutdown)
            except Exception as exc:  # noqa: BLE001 - closing goes on; the connections die with the loop
                logger.warning("%s did not shut down cleanly (closing its connections failed): %r", self.name, exc)
            finally:
                self.loop.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(shutdown, self.loop).result(self.close_timeout_s)
        except Exception as exc:  # noqa: BLE001 - closing goes on; the connections die with the loop
            logger.warning("%s did not shut down cleanly (closing its connections failed): %r", self.name, exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.close_timeout_s)
        if self.thread.is_alive():
            logger.warning(
                "%s did not stop within %.0f s (something blocks its event loop?); it is a daemon thread and "
                "dies with the process",
                self.name,
                self.close_timeout_s,
            )
            return
        self.loop.close()

    async def _shutdown(
        self, before: Callable[[], None] | None, finalizer: Callable[[], Coroutine[Any, Any, Any]] | None
    ) -> None:
        if before is not None:
            before()
        current = asyncio.current_task()
        running = [task for task in self._tasks if task is not current and not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=self.close_timeout_s / 2)
        if finalizer is not None:
            await finalizer()

    # ------------------------------------------------------------------ work on the loop

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """A task for ``coro`` on the loop, cancelled by :meth:`close` (call it on the loop)."""
        task = self.loop.create_task(coro, name=name)
        self._track(task)
        return task

    def run(self, coro_fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, timeout: float | None = None) -> T:
        """``await coro_fn(*args)`` on the loop and return its result: in the loop's thread once
        started (waiting at most ``timeout`` seconds), else in this thread."""
        self._refuse_own_thread("run")
        with self._lock:
            if self._closed:
                raise RolloutError(f"{self.label} is closed")
            if self.thread is None:
                return self.loop.run_until_complete(coro_fn(*args))
            future = self.submit(coro_fn(*args))
        return self.wait(future, timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread while it runs (directly on the loop's own thread, or
        while no thread runs the loop), and its result."""
        if self.on_thread():
            return fn(*args)
        with self._lock:
            if self._closed or self.thread is None:
                return fn(*args)

            async def call() -> T:
                return fn(*args)

            future = self.submit(call())
        return self.wait(future, None)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Send ``coro`` to the running loop as a tracked call; :meth:`wait` for its future."""
        return asyncio.run_coroutine_threadsafe(self._tracked(coro), self.loop)

    def wait(self, future: concurrent.futures.Future[T], timeout: float | None) -> T:
        """The result of a :meth:`submit` future; a call cancelled by :meth:`close`, or not answered
        within ``timeout`` seconds (then cancelled), raises :class:`RolloutError`."""
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            raise RolloutError(f"{self.label} was closed while this call ran") from None
        except concurrent.futures.TimeoutError:
            if future.done():
                raise
            future.cancel()
            raise RolloutError(
                f"{self.label} did not answer within {timeout:.0f} s: something blocks it{self.blocked_hint}"
            ) from None
        except BaseException:
            future.cancel()
            raise

    async def _tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._track(task)
        return await coro

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse_own_thread(self, what: str) -> None:
        if self.on_thread():
            raise RolloutError(f"{self.name}: {what}() would wait for its own event loop")
