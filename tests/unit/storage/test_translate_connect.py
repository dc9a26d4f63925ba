"""An S3 endpoint that a route or firewall prohibits: ``connect()`` fails with EACCES, which botocore
wraps in ``EndpointConnectionError``; that is a connection problem, not the identity's permissions
(it was reported as "permission denied ... check that this identity or user may do this here")."""

from __future__ import annotations

import errno

import botocore.exceptions

from storage.errors import StorageConnectionError, StoragePermissionError
from storage.translate import translate_error


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def test_a_prohibited_endpoint_is_a_connection_error() -> None:
    cause = PermissionError(errno.EACCES, "Permission denied")
    exc = _chained(botocore.exceptions.EndpointConnectionError(endpoint_url="http://10.0.0.1:9000/b/k"), cause)
    err = translate_error(exc, "write", "s3://b/k")
    assert isinstance(err, StorageConnectionError) and not isinstance(err, StoragePermissionError)
    assert "cannot connect to the storage endpoint" in str(err)


def test_a_local_permission_error_stays_a_permission_error() -> None:
    err = translate_error(PermissionError(errno.EACCES, "Permission denied"), "write", "file:///x")
    assert isinstance(err, StoragePermissionError)
