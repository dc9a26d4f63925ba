"""Pre-flight validation against a real S3-compatible server: a healthy bucket passes, and each planted
misconfiguration (credentials, bucket, endpoint, clock skew, read-only identity) fails the right check."""

from __future__ import annotations

import datetime as dt
import re
import time

import botocore.auth
import pytest

from storage.testing.runner import LocalProcessRunner
from storage.testing.seaweed import SeaweedS3Server
from storage.validate import Status, Thresholds, ValidationReport, validate_storage

pytestmark = pytest.mark.integration

FAST = Thresholds(probe_mb=1, latency_samples=2)
S3_CHECKS = ["s3.endpoint", "s3.clock_skew", "s3.credentials", "s3.bucket", "s3.multipart"]


def _statuses(report: ValidationReport) -> dict[str, str]:
    return {r.check: r.status.value for r in report.results}


def test_healthy_bucket_passes(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    report = validate_storage(f"s3://{s3_bucket}/runs", s3_server.storage_options(), thresholds=FAST)
    assert report.ok, report.to_json()
    assert [r.check for r in report.results] == [*S3_CHECKS, "storage.round_trip", "storage.throughput"]
    assert report.result("s3.multipart").details["bytes"] == 5 * 2**20 + 1024
    assert abs(report.result("s3.clock_skew").details["skew_s"]) <= 2
    assert report.storage["endpoint_url"] == s3_server.endpoint_url
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0  # probes removed


def test_wrong_credentials(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    options = {**s3_server.storage_options(), "secret": "wrong-secret"}
    report = validate_storage(f"s3://{s3_bucket}/runs", options, thresholds=FAST)
    failure = report.result("s3.credentials")
    assert failure.status is Status.FAIL
    assert "SignatureDoesNotMatch" in failure.message and "AWS_SECRET_ACCESS_KEY" in (failure.fix or "")
    assert _statuses(report)["s3.bucket"] == _statuses(report)["storage.round_trip"] == "skip"
    assert [f.check for f in report.failures()] == ["s3.credentials"]


def test_unknown_access_key(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    options = {**s3_server.storage_options(), "key": "AKNOBODY00000000"}
    failure = validate_storage(f"s3://{s3_bucket}/runs", options, thresholds=FAST).result("s3.credentials")
    assert failure.status is Status.FAIL and "InvalidAccessKeyId" in failure.message


def test_missing_bucket(s3_server: SeaweedS3Server) -> None:
    report = validate_storage("s3://bucket-that-is-missing/runs", s3_server.storage_options(), thresholds=FAST)
    assert [f.check for f in report.failures()] == ["s3.bucket"]
    failure = report.result("s3.bucket")
    assert "'bucket-that-is-missing' does not exist" in failure.message
    assert "aws s3 mb s3://bucket-that-is-missing" in (failure.fix or "")
    assert _statuses(report)["s3.credentials"] == "pass"
    assert _statuses(report)["s3.multipart"] == "skip"


def test_wrong_endpoint_connection_refused(closed_port: int) -> None:
    options = {"endpoint_url": f"http://127.0.0.1:{closed_port}", "key": "k", "secret": "s"}
    report = validate_storage("s3://some-bucket/runs", options, thresholds=FAST)
    failure = report.result("s3.endpoint")
    assert failure.status is Status.FAIL
    assert "Connection refused" in failure.message and "--endpoint-url" in (failure.fix or "")
    assert failure.path == f"http://127.0.0.1:{closed_port}"
    assert [f.check for f in report.failures()] == ["s3.endpoint"]
    assert all(s == "skip" for c, s in _statuses(report).items() if c != "s3.endpoint")


def test_clock_skew_rejected_by_the_server(
    s3_server: SeaweedS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests signed with a clock 30 minutes behind: the server answers RequestTimeTooSkewed."""
    real = botocore.auth.get_current_datetime

    def skewed(remove_tzinfo: bool = True) -> dt.datetime:
        return real(remove_tzinfo) - dt.timedelta(minutes=30)

    monkeypatch.setattr(botocore.auth, "get_current_datetime", skewed)
    report = validate_storage(f"s3://{s3_bucket}/runs", s3_server.storage_options(), thresholds=FAST)
    failure = report.result("s3.clock_skew")
    assert failure.status is Status.FAIL
    assert "RequestTimeTooSkewed" in failure.message and "chrony" in (failure.fix or "")
    assert [f.check for f in report.failures()] == ["s3.clock_skew"]
    assert _statuses(report)["s3.credentials"] == "skip"


def test_small_clock_skew_caught_from_the_date_header(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    """A clock 2 minutes off still signs acceptably, but exceeds the 30 s threshold."""
    report = validate_storage(
        f"s3://{s3_bucket}/runs", s3_server.storage_options(), thresholds=FAST, clock=lambda: time.time() - 120
    )
    failure = report.result("s3.clock_skew")
    assert failure.status is Status.FAIL
    assert -125 <= failure.details["skew_s"] <= -115
    assert re.search(r"clock is -1[12]\d s off the server's \(more than 30 s\)", failure.message)
    assert [f.check for f in report.failures()] == ["s3.clock_skew"]  # everything else still works


def test_read_only_identity_fails_the_write_checks(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    options = s3_server.storage_options(s3_server.readonly)
    report = validate_storage(f"s3://{s3_bucket}/runs", options, thresholds=FAST)
    statuses = _statuses(report)
    assert statuses["s3.credentials"] == statuses["s3.bucket"] == "pass"
    assert [f.check for f in report.failures()] == ["s3.multipart", "storage.round_trip"]
    assert "AccessDenied" in report.result("s3.multipart").message
    assert "s3:PutObject" in (report.result("s3.multipart").fix or "")
    assert "cannot write" in report.result("storage.round_trip").message


def test_multinode_probe_on_s3_with_credentials_from_the_environment(
    s3_server: SeaweedS3Server, s3_bucket: str
) -> None:
    report = validate_storage(
        f"s3://{s3_bucket}/runs", env=s3_server.env(), thresholds=FAST, nodes=2, runner=LocalProcessRunner()
    )
    assert report.ok, report.to_json()
    visibility = [r for r in report.results if r.check == "multinode.visibility"]
    assert [r.status for r in visibility] == [Status.PASS, Status.PASS]
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0
