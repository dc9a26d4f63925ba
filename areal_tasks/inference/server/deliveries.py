"""Finished sequences handed from the engine thread to an event loop in batches.

The engine thread finishes sequences one by one, and each request's handler awaits a future on
the server's event loop. Waking the loop from another thread (``call_soon_threadsafe``) rouses
the loop's thread, which then asks for the interpreter lock: the engine thread hands it over (at
the latest after the switch interval, 5 ms) and waits for it back while the loop runs. One
wake-up a finished sequence made that handover once a sequence: under bursts of 1,024 requests,
py-spy found a fifth of the engine thread's samples parked at the entry of the function after
each wake-up.

:class:`LoopDeliveries` queues each finish and wakes the loop only when no wake-up is already
pending, so a decode step that finishes many sequences costs one or a few wake-ups; the loop
resolves every queued future in one callback. Safe with any number of producing threads: a
producer that sees a wake-up pending appended its item before the pending drain clears the flag,
so that drain resolves it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LoopDeliveries(Generic[T]):
    """Resolves futures of one event loop from other threads, batching the loop's wake-ups."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: collections.deque[tuple[asyncio.Future[T], T]] = collections.deque()
        self._scheduled = False
        #: loop wake-ups requested (for tests and diagnostics).
        self.wakeups = 0

    def deliver(self, future: asyncio.Future[T], result: T) -> None:
        """Set ``future``'s result to ``result`` on the loop, soon (any thread; a future already
        done, e.g. cancelled, is left as it is). Raises ``RuntimeError`` if the loop is closed."""
        self._pending.append((future, result))
        if not self._scheduled:
            self._scheduled = True
            self.wakeups += 1
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                self._scheduled = False
                raise

    def _drain(self) -> None:
        self._scheduled = False  # before reading: an item appended from now on schedules its own drain
        while self._pending:
            future, result = self._pending.popleft()
            if not future.done():
                future.set_result(result)
