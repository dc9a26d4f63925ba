"""Retry policy: transient errors are retried with exponential backoff, permanent ones never are."""

from __future__ import annotations

import errno

import pytest

from storage import RetryPolicy, Storage, StorageNotFoundError, StorageTransientError, is_transient
from storage.errors import StoragePermissionError


class ClientError(Exception):
    """Shaped like botocore's ClientError (the classifier is duck-typed on ``response``)."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"{code} ({status})")
        self.response = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}


def _wrapped(cause: BaseException, outer: BaseException) -> BaseException:
    """``outer`` raised ``from cause``, the way s3fs wraps botocore errors."""
    try:
        raise outer from cause
    except BaseException as exc:  # noqa: BLE001 - building a chained exception for the test
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError("reset"),
        BrokenPipeError("pipe"),
        TimeoutError("timed out"),
        TimeoutError("timed out"),
        OSError(errno.ETIMEDOUT, "timed out"),
        ClientError("InternalError", 500),
        ClientError("ServiceUnavailable", 503),
        ClientError("SlowDown", 503),
        ClientError("TooManyRequests", 429),
        _wrapped(ClientError("InternalError", 500), OSError(errno.EREMOTEIO, "wrapped by s3fs")),
        type("ReadTimeoutError", (Exception,), {})("read timeout"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:20],
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("x"),
        PermissionError("x"),
        ConnectionRefusedError("nothing listens"),
        ClientError("AccessDenied", 403),
        ClientError("SignatureDoesNotMatch", 403),
        ClientError("NoSuchBucket", 404),
        ClientError("InvalidArgument", 400),
        ClientError("RequestTimeTooSkewed", 403),
        _wrapped(ClientError("AccessDenied", 403), PermissionError("wrapped by s3fs")),
        ValueError("a bug, not I/O"),
        StorageTransientError("already retried by an inner layer", attempts=4),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:20],
)
def test_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_delays_grow_exponentially_and_are_capped() -> None:
    policy = RetryPolicy(attempts=6, initial_delay_s=0.5, multiplier=2, max_delay_s=3, jitter=0)
    assert list(policy.delays()) == [0.5, 1.0, 2.0, 3, 3]


def test_jitter_stays_within_bounds() -> None:
    policy = RetryPolicy(attempts=50, initial_delay_s=1, multiplier=1, jitter=0.2)
    assert all(0.8 <= d <= 1.2 for d in policy.delays())


def test_transient_error_retried_with_backoff_then_succeeds() -> None:
    sleeps: list[float] = []
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    policy = RetryPolicy(attempts=4, initial_delay_s=0.1, jitter=0)
    assert policy.call(flaky, "read x", sleep=sleeps.append) == "ok"
    assert len(calls) == 3
    assert sleeps == [0.1, 0.2]


def test_permanent_error_raised_at_once() -> None:
    sleeps: list[float] = []
    calls = []

    def denied() -> None:
        calls.append(1)
        raise ClientError("AccessDenied", 403)

    with pytest.raises(ClientError):
        RetryPolicy(attempts=5, jitter=0).call(denied, "write x", sleep=sleeps.append)
    assert len(calls) == 1 and sleeps == []


def test_exhausted_retries_reraise_the_last_error_with_attempts() -> None:
    sleeps: list[float] = []

    def always() -> None:
        raise ClientError("SlowDown", 503)

    with pytest.raises(ClientError) as info:
        RetryPolicy(attempts=3, initial_delay_s=0.01, jitter=0).call(always, "write x", sleep=sleeps.append)
    assert info.value.retry_attempts == 3
    assert sleeps == [0.01, 0.02]


def test_invalid_policy() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_storage_translates_exhausted_and_permanent_errors() -> None:
    storage = Storage.from_url("memory://retry-unit", retry=RetryPolicy(attempts=3, initial_delay_s=0.001, jitter=0))
    calls = []

    def slow_down() -> None:
        calls.append(1)
        raise _wrapped(ClientError("SlowDown", 503), OSError(errno.EBUSY, "SlowDown"))

    with pytest.raises(StorageTransientError, match="after 3 attempt") as info:
        storage.run("write", "k", slow_down)
    assert info.value.attempts == 3 and len(calls) == 3

    def denied() -> None:
        raise _wrapped(ClientError("SignatureDoesNotMatch", 403), PermissionError("denied"))

    with pytest.raises(StoragePermissionError, match="secret key does not match"):
        storage.run("write", "k", denied)
    with pytest.raises(StorageNotFoundError):
        storage.read_bytes("missing")
