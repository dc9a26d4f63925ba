"""A second event loop on the rollout side, for weight swaps, so a swap never queues behind episodes.

The rollout executor's event loop runs every episode in flight: tokenising, building requests,
parsing answers, scoring. With a few hundred episodes in flight (an asynchronous run, eta > 0) it is
busy most of the time, and a weight swap posted to it waits for its turn before the servers are
even asked to pause, then again for the pause's and the resume's answers to be read, all while the
trainer waits (docs/benchmarks.md has the measured delays).

:class:`ControlLoop` is a :class:`~areal_tasks.rollout.loop_thread.LoopThread` (the same bridge the
executor's episodes loop uses), started at once, that does nothing but such control calls: the
swap's requests go out the moment the trainer asks, and their answers are read the moment they
arrive. The engine must allow it (``InferenceEngine.control_from_any_loop``: the HTTP client holds
every loop's requests during a pause).

The two threads still share one interpreter lock. A thread that waits for it gets it when the
holder reaches the switch interval (5 ms by default), and a swap needs it a few times (the request
sent, each answer read). :func:`prompt_thread_switches` lowers the interval for the duration of a
swap only, so the control thread waits at most about half a millisecond each time.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator

from areal_tasks.rollout.loop_thread import LoopThread

logger = logging.getLogger(__name__)

__all__ = ["SWAP_SWITCH_INTERVAL_S", "ControlLoop", "prompt_thread_switches"]

#: the interpreter's thread switch interval while a swap is in flight (seconds).
SWAP_SWITCH_INTERVAL_S = 0.0005

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


class ControlLoop(LoopThread):
    """An event loop in a daemon thread, started at once, that runs control coroutines for callers
    in other threads (``run``; ``close`` cancels those still running and runs a finaliser)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.start()
