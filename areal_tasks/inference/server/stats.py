"""Counters of the engine (tokens, requests, recent throughput) and the snapshot ``/metrics`` reads.

:class:`EngineCounters` is updated by the engine thread and read by HTTP handlers; it has its own
lock. Generation throughput is the number of tokens sampled over the last 10 seconds divided by
the time since the oldest of them; the finish rate (sequences finished per second, same window)
tells a client refused by a full queue when to come back (``Retry-After``).

Decode steps are timed on the host: the time the engine thread spent in them and, of that, the
time it waited for the device to finish a step's sampled tokens. A wait close to the whole step
means the device bounds decoding; a wait near zero means the host's own work (launches,
bookkeeping, finish checks) does, and a faster GPU would not help.

Admission prefills are counted and timed the same way (host seconds, read-back included): over
HTTP a burst that reaches the engine in several waves shows as more prefills than the burst needed.

Prompt positions are counted twice over: those prefilled (``prompt_tokens``, SGLang's
``prompt_tokens_total``) and those whose KV was reused instead (``cached_tokens``: prefix-cache
hits and the prompt copies of ``n > 1`` siblings; SGLang's ``cached_tokens_total``). Their ratio is
the cache hit rate.
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
    decode_steps_total: int = 0
    #: host seconds in decode steps, and the part of them spent waiting for the device.
    decode_seconds_total: float = 0.0
    decode_wait_seconds_total: float = 0.0
    #: admission prefills run (batches of prompts prefilled together) and the host seconds they took
    #: (prefill forward and first-token sampling, read back).
    prefill_batches_total: int = 0
    prefill_seconds_total: float = 0.0
    #: prompt positions whose KV was reused (prefix cache, ``n > 1`` siblings) instead of prefilled;
    #: ``prompt_tokens_total`` counts the prefilled ones.
    cached_tokens_total: int = 0
    #: whether the prefix cache is on; its entries (live and retained) and the positions retained.
    prefix_cache: bool = False
    prefix_cache_entries: int = 0
    prefix_cache_retained_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        """Reused prompt positions over all prompt positions admitted (0 before any)."""
        total = self.cached_tokens_total + self.prompt_tokens_total
        return self.cached_tokens_total / total if total else 0.0


class EngineCounters:
    """Monotonic counters plus a sliding window of sampled tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.decode_steps = 0
        self.decode_seconds = 0.0
        self.decode_wait_seconds = 0.0
        self.prefill_batches = 0
        self.prefill_seconds = 0.0
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._finished_at: collections.deque[float] = collections.deque()

    def add_prompt_tokens(self, count: int, cached: int = 0) -> None:
        """``count`` prompt positions prefilled and ``cached`` ones reused from cached KV."""
        with self._lock:
            self.prompt_tokens += count
            self.cached_tokens += cached

    def add_generated(self, count: int) -> None:
        with self._lock:
            self.generation_tokens += count
            self._recent.append((time.perf_counter(), count))

    def add_decode_step(self, seconds: float, waited: float) -> None:
        """One decode step: ``seconds`` on the host in all, ``waited`` of them blocked on the device."""
        with self._lock:
            self.decode_steps += 1
            self.decode_seconds += seconds
            self.decode_wait_seconds += waited

    def add_prefill(self, seconds: float) -> None:
        """One admission prefill (a batch of prompts) that took ``seconds`` on the host."""
        with self._lock:
            self.prefill_batches += 1
            self.prefill_seconds += seconds

    def add_finished(self) -> None:
        with self._lock:
            self.requests_finished += 1
            self._finished_at.append(time.perf_counter())
            self._forget_finishes(self._finished_at[-1])

    def _forget_finishes(self, now: float) -> None:
        while self._finished_at and now - self._finished_at[0] > THROUGHPUT_WINDOW_S:
            self._finished_at.popleft()

    def finish_rate(self) -> float:
        """Sequences finished per second over the last :data:`THROUGHPUT_WINDOW_S` seconds (0: none)."""
        with self._lock:
            now = time.perf_counter()
            self._forget_finishes(now)
            if not self._finished_at:
                return 0.0
            return len(self._finished_at) / max(now - self._finished_at[0], 1.0)

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
