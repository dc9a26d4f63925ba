"""S3 configuration problems found before any request: a missing profile, s3fs not installed."""

from __future__ import annotations

import sys

import pytest

from storage import Storage, StorageConfigError
from storage.validate import Status, validate_storage


def test_missing_profile_fails_the_first_check(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_PROFILE", "profile-that-does-not-exist")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    report = validate_storage("s3://some-bucket/x", {"endpoint_url": "http://127.0.0.1:9"})
    failure = report.result("s3.endpoint")
    assert failure.status is Status.FAIL
    assert "profile-that-does-not-exist" in failure.message and "AWS_PROFILE" in (failure.fix or "")
    assert [r.status for r in report.results[1:]] == [Status.SKIP] * (len(report.results) - 1)


def test_s3_without_s3fs_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # makes `import s3fs` raise ImportError
    with pytest.raises(StorageConfigError, match="needs s3fs: pip install 's3fs\\[boto3\\]==2026.9.0'"):
        Storage.from_url("s3://some-bucket/x")
