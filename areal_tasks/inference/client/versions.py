"""Which policy version produced a piece of output, for servers that do not report it per token.

SGLang (with ``weight_version``) and the embedded server tag every output token with the version of
the weights that produced it; vLLM does not. For such servers the client infers it from *when the
answer arrived*, using a timeline of the moments from which the servers may generate with each
version:

- a weight update made while the servers are paused takes effect when the client *sends* the next
  resume: a paused server holds every request (running ones were aborted by an ``abort`` pause, new
  ones wait), so nothing it answers after that moment was generated before it, and nothing it
  answered between the pause and the resume was generated after the update;
- a weight update made while the servers run takes effect when it completes (a piece in flight
  across it may mix old and new tokens; it is tagged with the new version).

Tagging by the version *at send time* is wrong: a request sent just before a pause can reach the
server after it, wait there through the update and run on the new weights.

The one case this cannot attribute is a piece whose answer was delayed in transit for longer than a
whole pause-update-resume cycle (it would be tagged with the newer version), and a pause in a mode
that keeps sequences running across the update (``retract``/``in_place``), whose pieces mix versions.

The timeline is thread-safe: a weight swap may record its moments from another thread's event
loop than the one reading them (``areal_tasks.rollout.control_loop``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable


class VersionTimeline:
    """Moments (``time.monotonic``) from which each version may have produced output."""

    def __init__(self, version: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._times: list[float] = [float("-inf")]
        self._versions: list[int] = [version]
        self._pending: int | None = None
        self._lock = threading.Lock()

    def at(self, moment: float) -> int:
        """The version in effect at ``moment`` (a ``time.monotonic`` reading)."""
        with self._lock:
            return self._versions[bisect.bisect_right(self._times, moment) - 1]

    def updated(self, version: int, *, paused: bool) -> None:
        """Weights of ``version`` are loaded: in effect now, or at the next :meth:`resuming` if paused."""
        with self._lock:
            if paused:
                self._pending = version
            else:
                self._append(version)

    def resuming(self) -> None:
        """The client is about to send a resume: a pending update takes effect from now."""
        with self._lock:
            if self._pending is not None:
                self._append(self._pending)
                self._pending = None

    def reset(self, version: int) -> None:
        """The version was set by hand (``set_version``): it holds from now."""
        with self._lock:
            self._pending = None
            self._append(version)

    def _append(self, version: int) -> None:  # under the lock
        now = self._clock()
        if now <= self._times[-1]:  # a coarse clock: keep the list strictly increasing
            now = self._times[-1] + 1e-9
        self._times.append(now)
        self._versions.append(version)
        if len(self._times) > 4096:  # keep memory bounded over a long run; old moments no longer matter
            del self._times[:2048], self._versions[:2048]
            self._times[0] = float("-inf")
