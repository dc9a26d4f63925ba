"""Retry policy of generate attempts: which failures are retried and how long to wait in between."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["RetryPolicy", "is_retryable_status"]


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
