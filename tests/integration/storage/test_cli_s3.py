"""``areal storage validate s3://...`` with credentials from the environment and ``--endpoint-url``."""

from __future__ import annotations

import json

import pytest

from areal_tasks.cli import main
from storage.testing.seaweed import SeaweedS3Server

pytestmark = pytest.mark.integration


def _use_env(monkeypatch: pytest.MonkeyPatch, server: SeaweedS3Server, **override: str) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = {**server.env(), **override}
    env.pop("AWS_ENDPOINT_URL_S3")  # the endpoint comes from the flag
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_s3_validate_passes_with_env_credentials(
    s3_server: SeaweedS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_env(monkeypatch, s3_server)
    code = main(
        [
            "storage",
            "validate",
            f"s3://{s3_bucket}/runs",
            "--endpoint-url",
            s3_server.endpoint_url,
            "--region",
            "us-east-1",
            "--probe-mb",
            "1",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["storage"]["credentials_source"].endswith("from env AWS_ACCESS_KEY_ID")
    assert report["storage"]["endpoint_source"] == "options"
    assert {c["check"]: c["status"] for c in report["checks"]}["s3.multipart"] == "pass"


def test_s3_validate_wrong_secret_exits_1(
    s3_server: SeaweedS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_env(monkeypatch, s3_server, AWS_SECRET_ACCESS_KEY="wrong")
    code = main(["storage", "validate", f"s3://{s3_bucket}/runs", "--endpoint-url", s3_server.endpoint_url])
    out = capsys.readouterr()
    assert code == 1
    (failed,) = [c for c in json.loads(out.out)["checks"] if c["status"] == "fail"]
    assert failed["check"] == "s3.credentials" and "SignatureDoesNotMatch" in failed["message"]
    assert "wrong" not in out.out  # the secret never appears in the report
