"""The one clock of a run's perf trace: wall-clock epoch microseconds, advanced by a monotonic clock.

Each process anchors once, at import, ``time.time_ns()`` (the host's wall clock, NTP-disciplined on a
cluster) to ``time.perf_counter_ns()``; every later timestamp is the anchor plus the monotonic time
elapsed since. Durations are therefore monotonic and never negative (a wall-clock step during the run
does not bend them), and timestamps of processes on one host agree to the resolution of
``time.time_ns()`` at their anchors (microseconds). Across hosts they agree as well as the hosts'
clocks do (NTP: typically well under a millisecond on a LAN, PTP: microseconds); ``docs/tracing.md``
says what that means for reading a trace.
"""

from __future__ import annotations

import time

__all__ = ["anchor_us", "now_us"]

_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.perf_counter_ns()


def now_us() -> float:
    """Microseconds since the epoch, on this process's anchored monotonic clock."""
    return (_ANCHOR_WALL_NS + (time.perf_counter_ns() - _ANCHOR_MONO_NS)) / 1000.0


def anchor_us() -> float:
    """This process's anchor (epoch microseconds of its wall clock when the module was imported)."""
    return _ANCHOR_WALL_NS / 1000.0
