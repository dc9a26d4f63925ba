"""Turn backend exceptions (OSError, botocore, aiohttp) into :mod:`storage.errors` types with a clear message.

Only I/O-shaped failures are translated; anything else (a bug, a ``TypeError``) propagates as it is.
"""

from __future__ import annotations

import errno

from storage.errors import (
    StorageConnectionError,
    StorageError,
    StorageIOError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
)
from storage.retry import exception_chain, http_status_and_code, is_transient

__all__ = ["error_code", "translate_error"]

_AUTH_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "AllAccessDisabled"}
)
_KEY_HINT = "check the access key and secret (key/secret options or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
_AUTH_HINTS = {
    "InvalidAccessKeyId": "the access key is unknown to this endpoint; " + _KEY_HINT,
    "SignatureDoesNotMatch": "the secret key does not match the access key; " + _KEY_HINT,
    "403": "the request was refused; " + _KEY_HINT + ", and the identity's permissions",
    "ExpiredToken": "the session token has expired; refresh the credentials",
    "InvalidToken": "the session token is invalid; refresh the credentials",
}
_NOT_FOUND_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "404"})
_CONNECTION_CLASS_NAMES = frozenset({"EndpointConnectionError", "ClientConnectorError", "NewConnectionError"})
_CREDENTIAL_CLASS_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"})


def error_code(exc: BaseException) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``SignatureDoesNotMatch``...) somewhere in ``exc``'s chain."""
    for err in exception_chain(exc):
        _, code = http_status_and_code(err)
        if code is not None:
            return code
    return None


def _is_io_shaped(exc: BaseException) -> bool:
    for err in exception_chain(exc):
        if isinstance(err, OSError) or http_status_and_code(err) != (None, None):
            return True
        if type(err).__name__ in _CONNECTION_CLASS_NAMES | _CREDENTIAL_CLASS_NAMES:
            return True
        if type(err).__module__.split(".")[0] in ("botocore", "aiohttp", "aiobotocore", "urllib3"):
            return True
    return False


def translate_error(exc: BaseException, what: str, location: str) -> BaseException:
    """The storage error for ``exc`` raised while doing ``what`` on ``location`` (``exc`` itself if not I/O).

    The caller raises the result ``from exc``.
    """
    if isinstance(exc, StorageError) or not _is_io_shaped(exc):
        return exc
    detail = f"{type(exc).__name__}: {exc}"
    code = error_code(exc)
    names = {type(err).__name__ for err in exception_chain(exc)}
    if names & _CREDENTIAL_CLASS_NAMES:
        return StoragePermissionError(
            f"{what} {location}: no usable S3 credentials ({detail}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the key/secret storage options"
        )
    if code is None and names & _CONNECTION_CLASS_NAMES:
        # before the PermissionError test: connect() failing with EACCES (a route or firewall that
        # prohibits the endpoint) is a network problem, not the identity's permissions
        return StorageConnectionError(f"{what} {location}: cannot connect to the storage endpoint ({detail})")
    if code in _AUTH_CODES or any(isinstance(err, PermissionError) for err in exception_chain(exc)):
        hint = _AUTH_HINTS.get(code or "", "check that this identity or user may do this here")
        return StoragePermissionError(f"{what} {location}: permission denied ({code or detail}): {hint}")
    if code in _NOT_FOUND_CODES or any(isinstance(err, FileNotFoundError) for err in exception_chain(exc)):
        if code == "NoSuchBucket":
            return StorageNotFoundError(
                f"{what} {location}: the bucket does not exist (NoSuchBucket): create it or fix the URL"
            )
        return StorageNotFoundError(f"{what} {location}: not found ({code or detail})")
    if names & _CONNECTION_CLASS_NAMES or any(isinstance(err, ConnectionRefusedError) for err in exception_chain(exc)):
        return StorageConnectionError(f"{what} {location}: cannot connect to the storage endpoint ({detail})")
    if is_transient(exc):
        attempts = int(getattr(exc, "retry_attempts", 1))
        return StorageTransientError(
            f"{what} {location}: still failing after {attempts} attempt(s) ({detail})", attempts
        )
    if any(isinstance(err, OSError) and err.errno == errno.EROFS for err in exception_chain(exc)):
        return StoragePermissionError(f"{what} {location}: read-only filesystem ({detail})")
    return StorageIOError(f"{what} {location}: {detail}")
