"""Retry policy of generate attempts: which failures are retried and how long to wait in between.

A 429 that says when to come back (``Retry-After``: the server's queue is full) is not a failure
of the request: the core waits that long (at most :data:`MAX_RETRY_AFTER_S` at a time) and tries
again without spending one of ``max_retries``, for as long as the request timeout lasts
(:func:`overload_wait`); past it, a 429 counts like any other retryable status.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["MAX_RETRY_AFTER_S", "RetryPolicy", "is_retryable_status", "overload_wait"]

#: the longest one ``Retry-After`` wait honoured (a server may ask for more; it is asked again then).
MAX_RETRY_AFTER_S = 30.0


def is_retryable_status(status: int) -> bool:
    """HTTP statuses worth another attempt: request timeout, too many requests, server errors."""
    return status in (408, 429) or status >= 500


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``backoff_s * 2**retry``, capped, spread by ``+-jitter`` (relative)."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float
    jitter: float = 0.0

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        base = min(self.max_backoff_s, self.backoff_s * 2**retry)
        if self.jitter <= 0:
            return base
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return base * (1.0 + spread)


def overload_wait(retry_after_s: float | None, remaining_s: float) -> float | None:
    """Seconds to wait before trying again after a 429 without spending a retry: its
    ``Retry-After`` (capped at :data:`MAX_RETRY_AFTER_S`); None when it gave none or the wait would
    not end within ``remaining_s`` (the request's time for waiting out full queues)."""
    if retry_after_s is None:
        return None
    wait = min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S)
    return wait if wait <= remaining_s else None
