"""Counters of the engine (tokens, requests, recent throughput) and the snapshot ``/metrics`` reads.

:class:`EngineCounters` is updated by the engine thread and read by HTTP handlers; it has its own
lock. Generation throughput is the number of tokens sampled over the last 10 seconds divided by
the time since the oldest of them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine for ``/metrics`` and ``/server_info``."""

    num_running: int
    num_waiting: int
    paused: str | None
    #: a weight update holds new requests back until the requests in flight finish.
    draining: bool
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    gen_throughput: float
    cache_used_tokens: int
    cache_capacity_tokens: int
    weight_version: str


class EngineCounters:
    """Monotonic counters plus a sliding window of sampled tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def add_prompt_tokens(self, count: int) -> None:
        with self._lock:
            self.prompt_tokens += count

    def add_generated(self, count: int) -> None:
        with self._lock:
            self.generation_tokens += count
            self._recent.append((time.perf_counter(), count))

    def add_finished(self) -> None:
        with self._lock:
            self.requests_finished += 1

    def throughput(self) -> float:
        """Sampled tokens per second over the last :data:`THROUGHPUT_WINDOW_S` seconds."""
        with self._lock:
            now = time.perf_counter()
            while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
                self._recent.popleft()
            if not self._recent:
                return 0.0
            span = max(now - self._recent[0][0], 1e-3)
            return sum(n for _, n in self._recent) / span
