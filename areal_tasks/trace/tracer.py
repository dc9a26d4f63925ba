"""The perf tracer of one process: spans buffered in memory, appended to the process's part file.

``span(name, cat, **args)`` is the whole instrumentation API (with :func:`set_step` for sampling):
when this process has no tracer, or the current step is not sampled (``trace.every_n_steps``), it
returns one shared no-op context manager, so a disabled tracer costs a global read and a call (no
string formatting, no clock read, no allocation beyond the call's keyword dict). When on, a span is
two clock reads and one dict appended under a lock; the buffer goes to ``<trace dir>/<part>.jsonl``
(one JSON trace event a line) every second or every 1000 events, at :func:`flush`, and at exit.

Spans of one thread nest (Chrome's complete events on one ``tid``). Spans that overlap without
nesting on one thread, the client's generate calls and the server's requests on an event loop, pass
``concurrent=True``: each takes the lowest free "lane", a virtual thread of its own, named
``<thread> lane <k>``, so every lane still nests.

Only ``trace.max_events`` spans are kept per process; the number dropped after that is written as
the process's ``process_labels`` metadata when the tracer closes.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from areal_tasks.trace.clock import now_us
from areal_tasks.trace.events import complete_event, metadata_event

logger = logging.getLogger(__name__)

__all__ = ["NULL_SPAN", "Tracer", "current", "flush", "install", "set_step", "span", "uninstall"]

#: virtual thread ids of concurrent-span lanes start here (above any Linux thread id: pid_max <= 2**22).
LANE_TID_BASE = 100_000_000
#: seconds between two writes of the buffer (at a span's end).
FLUSH_INTERVAL_US = 1_000_000.0
#: events buffered before a write regardless of time.
FLUSH_EVENTS = 1000


class _NullSpan:
    """The span of a process without a tracer or of a step not sampled: does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set(self, **args: Any) -> None:
        """Arguments known only inside the span (ignored here)."""


NULL_SPAN = _NullSpan()


class _Span:
    """One span being timed; recorded on exit (with ``error`` set to the exception's type if any)."""

    __slots__ = ("args", "cat", "concurrent", "lane", "name", "start", "tracer")

    def __init__(self, tracer: Tracer, name: str, cat: str, concurrent: bool, args: dict[str, Any]) -> None:
        self.tracer, self.name, self.cat, self.concurrent, self.args = tracer, name, cat, concurrent, args
        self.lane = -1
        self.start = 0.0

    def __enter__(self) -> _Span:
        if self.concurrent:
            self.lane = self.tracer._take_lane()
        self.start = now_us()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        end = now_us()
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        self.tracer._record(self, end)

    def set(self, **args: Any) -> None:
        """Arguments known only inside the span (sizes, outcomes)."""
        self.args.update(args)


class Tracer:
    """The tracer of one process (see the module docstring). ``directory`` holds the run's part
    files; ``role`` names the process in the trace (``controller``, ``train rank 0``, ``server 1``)."""

    def __init__(
        self, directory: str | os.PathLike[str], role: str, every_n_steps: int = 1, max_events: int = 1_000_000
    ) -> None:
        self.directory = Path(directory)
        self.role = role
        self.every_n_steps = max(1, every_n_steps)
        self.max_events = max_events
        self.pid = os.getpid()
        host = socket.gethostname().split(".")[0] or "host"
        safe_role = "".join(c if c.isalnum() else "_" for c in role)
        self.path = self.directory / f"{safe_role}-{host}-{self.pid}.jsonl"
        self.sampled = True
        self.step: int | None = None
        self._loop_sets_step = False
        self.recorded = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._buffer: list[dict[str, Any]] = [
            metadata_event("process_name", self.pid, 0, role),
            metadata_event("process_labels", self.pid, 0, f"host {host}"),
        ]
        self._threads: set[int] = set()
        self._free_lanes: list[int] = []
        self._n_lanes = 0
        self._last_flush = now_us()
        self._failed = False
        self._closed = False

    # -- sampling --------------------------------------------------------------------------------

    def set_step(self, step: int | None, *, weak: bool = False) -> None:
        """Spans from now on belong to ``step`` (1-based); recorded when ``(step - 1) % every_n_steps
        == 0``. ``None``: outside any step, always recorded. A ``weak`` setting (a server or the
        rollout side guessing the step from the policy version) is ignored in a process where the
        RL loop sets the step itself (train rank 0 with the rollout side in a thread)."""
        if weak and self._loop_sets_step:
            return
        if not weak:
            self._loop_sets_step = True
        self.step = step
        self.sampled = step is None or (step - 1) % self.every_n_steps == 0

    # -- spans -----------------------------------------------------------------------------------

    def span(self, name: str, cat: str, concurrent: bool, args: dict[str, Any]) -> _Span | _NullSpan:
        if not self.sampled or self._closed or self._failed:
            return NULL_SPAN
        if self.step is not None:
            args["step"] = self.step
        return _Span(self, name, cat, concurrent, args)

    def _take_lane(self) -> int:
        with self._lock:
            if self._free_lanes:
                return self._free_lanes.pop()
            self._n_lanes += 1
            lane, tid = self._n_lanes, LANE_TID_BASE + self._n_lanes
            self._buffer.append(metadata_event("thread_name", self.pid, tid, f"{self.role} lane {lane}"))
            self._buffer.append(metadata_event("thread_sort_index", self.pid, tid, 1000 + lane))
            return lane

    def _record(self, span: _Span, end: float) -> None:
        tid = LANE_TID_BASE + span.lane if span.concurrent else threading.get_native_id()
        event = complete_event(span.name, span.cat, span.start, end - span.start, self.pid, tid, span.args)
        with self._lock:
            if span.concurrent:
                self._free_lanes.append(span.lane)
                self._free_lanes.sort(reverse=True)  # the lowest free lane is taken next
            if self.recorded >= self.max_events:
                self.dropped += 1
                return
            if not span.concurrent and tid not in self._threads:
                self._threads.add(tid)
                self._buffer.append(metadata_event("thread_name", self.pid, tid, threading.current_thread().name))
            self._buffer.append(event)
            self.recorded += 1
            due = len(self._buffer) >= FLUSH_EVENTS or end - self._last_flush >= FLUSH_INTERVAL_US
        if due:
            self.flush()

    # -- output ----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Append the buffered events to the part file. A write that fails turns the tracer off
        (logged once): tracing never stops a run."""
        with self._write_lock:
            with self._lock:
                events, self._buffer = self._buffer, []
                self._last_flush = now_us()
            if not events or self._failed:
                return
            text = "".join(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in events)
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text)
            except OSError as exc:
                self._failed = True
                logger.warning("perf trace: cannot write %s (%s); tracing is off in this process", self.path, exc)

    def close(self) -> None:
        """Write what is left (and how many spans ``max_events`` dropped); later spans are not recorded."""
        if self._closed:
            return
        if self.dropped:
            with self._lock:
                self._buffer.append(
                    metadata_event(
                        "process_labels",
                        self.pid,
                        0,
                        f"dropped {self.dropped} spans (trace.max_events={self.max_events})",
                    )
                )
            logger.warning("perf trace: %d spans over trace.max_events=%d were dropped", self.dropped, self.max_events)
        self.flush()
        self._closed = True


_current: Tracer | None = None


def install(tracer: Tracer) -> Tracer:
    """Make ``tracer`` this process's tracer (closing any previous one); flushed at exit."""
    global _current
    previous = _current
    if previous is not None:
        previous.close()
    _current = tracer
    atexit.register(tracer.close)
    logger.info("perf trace on: %s writes %s", tracer.role, tracer.path)
    return tracer


def uninstall() -> None:
    """Close and remove this process's tracer (spans become no-ops again)."""
    global _current
    tracer, _current = _current, None
    if tracer is not None:
        tracer.close()
        atexit.unregister(tracer.close)


def current() -> Tracer | None:
    """This process's tracer, or None when tracing is off."""
    return _current


def span(name: str, cat: str, /, *, concurrent: bool = False, **args: Any) -> _Span | _NullSpan:
    """A context manager timing ``name`` (category ``cat``) on this process's tracer; a shared
    no-op when there is none or the step is not sampled. ``args`` land in the event's ``args``:
    pass values, never preformatted strings."""
    tracer = _current
    if tracer is None:
        return NULL_SPAN
    return tracer.span(name, cat, concurrent, args)


def set_step(step: int | None, *, weak: bool = False) -> None:
    """The step the next spans of this process belong to (see :meth:`Tracer.set_step`)."""
    tracer = _current
    if tracer is not None:
        tracer.set_step(step, weak=weak)


def flush() -> None:
    """Write this process's buffered spans now (e.g. before a process may be killed)."""
    tracer = _current
    if tracer is not None:
        tracer.flush()


def _forget_in_child() -> None:
    """A forked child starts without its parent's tracer (it would write the parent's part file
    under the parent's pid); its entry point installs its own."""
    global _current
    _current = None


os.register_at_fork(after_in_child=_forget_in_child)
