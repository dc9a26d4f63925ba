"""Retries with exponential backoff, for transient storage errors only.

Transient: connection resets and aborts, broken pipes, timeouts, HTTP 5xx, throttling (429,
``SlowDown``, ``Throttling``...). Permanent, never retried: not found, permission and authentication
errors, any other 4xx, a refused connection (nothing listens there; retrying only hides a wrong
endpoint), and every non-I/O exception. The classifier looks at the exception and its chain
(``__cause__``/``__context__``) because s3fs wraps botocore errors in ``OSError`` subclasses.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from storage.errors import StorageError

__all__ = ["RetryPolicy", "exception_chain", "http_status_and_code", "is_transient"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT, errno.EAGAIN, errno.EREMOTEIO}
)
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)
# Exception class names from botocore/aiohttp/urllib3, matched by name so this module needs none of them.
_TRANSIENT_CLASS_NAMES = frozenset(
    {
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "ProtocolError",
        "FSTimeoutError",
    }
)


def http_status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and S3 error code of a botocore ``ClientError`` (``(None, None)`` for others)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code")
    return (int(status) if status is not None else None), (str(code) if code is not None else None)


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) is a transient storage error worth retrying."""
    for err in exception_chain(exc):
        if isinstance(err, StorageError):
            return False  # already classified (and, if transient, already retried) by an inner layer
        if isinstance(err, (FileNotFoundError, PermissionError, ConnectionRefusedError)):
            return False
        status, code = http_status_and_code(err)
        if status is not None or code is not None:
            return (status is not None and (status >= 500 or status == 429)) or code in _THROTTLING_CODES
        if isinstance(
            err, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, TimeoutError, socket.timeout)
        ):
            return True
        if type(err).__name__ in _TRANSIENT_CLASS_NAMES:
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: attempt 1, wait ``initial_delay_s``, attempt 2, wait ``x multiplier``...

    ``jitter`` spreads each wait by up to that fraction (0 makes waits exact, as tests want).
    ``attempts=1`` disables retrying.
    """

    attempts: int = 4
    initial_delay_s: float = 0.2
    multiplier: float = 2.0
    max_delay_s: float = 5.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts!r} must be >= 1")
        if self.initial_delay_s < 0 or self.max_delay_s < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(
                "RetryPolicy needs initial_delay_s >= 0, max_delay_s >= 0, multiplier >= 1 and 0 <= jitter <= 1"
            )

    def delays(self) -> Iterator[float]:
        """The waits between attempts (``attempts - 1`` of them)."""
        delay = self.initial_delay_s
        for _ in range(self.attempts - 1):
            capped = min(delay, self.max_delay_s)
            yield capped * (1 + self.jitter * (2 * random.random() - 1))
            delay *= self.multiplier

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        classify: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """Run ``fn`` until it succeeds, retrying transient errors; re-raise the last error otherwise.

        The last transient error is re-raised unchanged after the final attempt, with
        ``retry_attempts`` set on it so callers can report how often it was tried.
        """
        delays = self.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                if not classify(exc):
                    raise
                delay = next(delays, None)
                if delay is None:
                    exc.retry_attempts = attempt  # type: ignore[attr-defined]
                    raise
                logger.warning(
                    "%s failed with a transient error (attempt %d/%d), retrying in %.2fs: %s",
                    what,
                    attempt,
                    self.attempts,
                    delay,
                    exc,
                )
                sleep(delay)
