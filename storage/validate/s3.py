"""S3 checks: the endpoint answers, the clock agrees with the server's, the credentials are valid,
the bucket exists and may be listed, and a multipart upload completes.

They talk to S3 through a plain botocore client (no retries) built from the Storage's own settings,
so a failure names the S3 error code. One signed ``ListObjectsV2`` on the bucket answers three
questions at once: ``RequestTimeTooSkewed`` is a clock problem, ``InvalidAccessKeyId`` and
``SignatureDoesNotMatch`` are credential problems, ``NoSuchBucket``/``AccessDenied`` bucket problems.
"""

from __future__ import annotations

import email.utils
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from storage.translate import error_code
from storage.validate.context import CheckContext, CheckFailed, Outcome
from storage.validate.report import CheckResult, Status

__all__ = ["MULTIPART_PART_BYTES", "run_s3_checks"]

MULTIPART_PART_BYTES = 5 * 2**20  # the S3 minimum for every part but the last

logger = logging.getLogger(__name__)

_BAD_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"})
_CREDENTIALS_FIX = (
    "set valid credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary "
    "ones), AWS_PROFILE, or the key/secret storage options; check they belong to this endpoint"
)
_CLOCK_FIX = "synchronise this machine's clock (chrony/ntpd/systemd-timesyncd); S3 rejects requests signed >15 min off"


@dataclass
class _ListProbe:
    """The outcome of one signed ListObjectsV2 on the bucket."""

    code: str | None = None
    error: BaseException | None = None


def _client(ctx: CheckContext) -> Any:
    import botocore
    import botocore.config
    import botocore.session

    fs = ctx.storage.fs
    config: dict[str, Any] = {
        "connect_timeout": fs.config_kwargs.get("connect_timeout", 5),
        "read_timeout": fs.config_kwargs.get("read_timeout", 60),
        "retries": {"total_max_attempts": 1},
    }
    if "s3" in fs.config_kwargs:
        config["s3"] = fs.config_kwargs["s3"]
    if fs.anon:
        config["signature_version"] = botocore.UNSIGNED
    session = botocore.session.Session(profile=fs.kwargs.get("profile"))
    return session.create_client(
        "s3",
        endpoint_url=fs.endpoint_url,
        region_name=fs.client_kwargs.get("region_name"),
        aws_access_key_id=fs.key,
        aws_secret_access_key=fs.secret,
        aws_session_token=fs.token,
        config=botocore.config.Config(**config),
    )


def _check_endpoint(endpoint: str, timeout_s: float, state: dict[str, Any]) -> Outcome:
    import urllib.error
    import urllib.request

    start = time.perf_counter()
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as response:
            status, date = response.status, response.headers.get("Date")
    except urllib.error.HTTPError as exc:  # any HTTP answer means something serves there
        status, date = exc.code, exc.headers.get("Date")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CheckFailed(
            f"no answer from {endpoint}: {reason}",
            "check the endpoint URL (--endpoint-url or AWS_ENDPOINT_URL_S3), that the S3 server runs, and that "
            "this node can reach it",
        ) from exc
    state["server_date"] = date
    latency_ms = round((time.perf_counter() - start) * 1e3, 2)
    return Outcome(
        f"{endpoint} answered HTTP {status} in {latency_ms} ms", {"http_status": status, "latency_ms": latency_ms}
    )


def _list_probe(client: Any, bucket: str, prefix: str) -> _ListProbe:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except ClientError as exc:
        return _ListProbe(code=error_code(exc) or "unknown", error=exc)
    except BotoCoreError as exc:
        return _ListProbe(code=type(exc).__name__, error=exc)
    return _ListProbe()


def _check_clock(ctx: CheckContext, server_date: str | None, probe: _ListProbe) -> Outcome:
    if probe.code == "RequestTimeTooSkewed":
        raise CheckFailed(f"the server rejected a signed request: {probe.error}", _CLOCK_FIX)
    if not server_date:
        return Outcome("the endpoint sent no Date header; signed requests were accepted", {}, Status.PASS)
    server = email.utils.parsedate_to_datetime(server_date).timestamp()
    skew = ctx.clock() - server
    details = {"skew_s": round(skew, 1), "max_clock_skew_s": ctx.thresholds.max_clock_skew_s}
    # the Date header has one-second resolution: allow one more second
    if abs(skew) > ctx.thresholds.max_clock_skew_s + 1:
        raise CheckFailed(
            f"this machine's clock is {skew:+.0f} s off the server's (more than {ctx.thresholds.max_clock_skew_s:g} s)",
            _CLOCK_FIX,
            details,
        )
    return Outcome(f"clock within {abs(skew):.0f} s of the server's", details)


def _check_credentials(ctx: CheckContext, probe: _ListProbe) -> Outcome:
    described = ctx.storage.describe().get("credentials_source", "unknown")
    if probe.code in _BAD_CREDENTIAL_CODES:
        raise CheckFailed(f"credentials ({described}) rejected: {probe.code}: {probe.error}", _CREDENTIALS_FIX)
    if probe.code in ("NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"):
        raise CheckFailed(f"no usable credentials: {probe.error}", _CREDENTIALS_FIX)
    if probe.error is not None and probe.code not in ("NoSuchBucket", "AccessDenied"):
        raise CheckFailed(
            f"signed request failed: {probe.error}", "see the message; check the endpoint and credentials"
        )
    return Outcome(f"credentials accepted ({described})", {"credentials_source": described})


def _check_bucket(ctx: CheckContext, probe: _ListProbe) -> Outcome:
    bucket = ctx.storage.url.bucket
    if probe.code == "NoSuchBucket":
        raise CheckFailed(
            f"bucket {bucket!r} does not exist at this endpoint",
            f"create it (e.g. aws s3 mb s3://{bucket} --endpoint-url ...) or correct the URL",
        )
    if probe.code == "AccessDenied":
        raise CheckFailed(
            f"the credentials may not list bucket {bucket!r} (AccessDenied)",
            "grant this identity s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on the bucket",
        )
    return Outcome(f"bucket {bucket!r} exists and may be listed")


def _check_multipart(ctx: CheckContext, client: Any) -> Outcome:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = ctx.storage.url.bucket, ctx.storage.url.key_prefix
    key = "/".join(p for p in (prefix, ctx.scratch, "multipart.bin") if p)
    parts = [os.urandom(MULTIPART_PART_BYTES), os.urandom(1024)]
    upload_id = None
    try:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        done = []
        for number, body in enumerate(parts, start=1):
            etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]
            done.append({"PartNumber": number, "ETag": etag})
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done})
        upload_id = None
        size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        edge = MULTIPART_PART_BYTES
        seam = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={edge - 8}-{edge + 7}")["Body"].read()
        client.delete_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as exc:
        if upload_id is not None:
            _abort(client, bucket, key, upload_id)
        raise CheckFailed(
            f"multipart upload of s3://{bucket}/{key} failed: {exc}",
            "large files are uploaded in parts: the endpoint (and any proxy before it) must support multipart "
            "uploads, and the identity needs s3:PutObject and s3:AbortMultipartUpload",
        ) from exc
    expected = sum(len(p) for p in parts)
    if size != expected or seam != parts[0][-8:] + parts[1][:8]:
        raise CheckFailed(
            f"multipart object reads back wrong (size {size}, expected {expected}, or the part seam differs)",
            "the endpoint assembles multipart uploads incorrectly; report it to the storage operator",
        )
    return Outcome(
        f"uploaded, completed and read back a {len(parts)}-part object of {expected} bytes", {"bytes": expected}
    )


def _abort(client: Any, bucket: str, key: str, upload_id: str) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except (ClientError, BotoCoreError) as exc:  # the multipart failure is what gets reported
        logger.error("could not abort multipart upload %s of %s: %s", upload_id, key, exc)


def run_s3_checks(ctx: CheckContext) -> bool:
    """Run the S3 control-plane checks; True if the data-plane checks (round trip...) may follow."""
    from botocore.exceptions import BotoCoreError

    later = ("s3.clock_skew", "s3.credentials", "s3.bucket", "s3.multipart")
    try:
        client = _client(ctx)
    except BotoCoreError as exc:  # e.g. AWS_PROFILE names a profile that does not exist
        ctx.report.results.append(
            CheckResult(
                "s3.endpoint",
                Status.FAIL,
                ctx.node,
                str(ctx.storage.url),
                f"cannot configure an S3 client: {exc}",
                _CREDENTIALS_FIX,
            )
        )
        for check in later:
            ctx.skip(check, "not run: no S3 client")
        return False
    endpoint = client.meta.endpoint_url
    state: dict[str, Any] = {}
    timeout = float(ctx.storage.fs.config_kwargs.get("connect_timeout", 5))
    if ctx.run("s3.endpoint", lambda: _check_endpoint(endpoint, timeout, state), path=endpoint).status is Status.FAIL:
        for check in later:
            ctx.skip(check, "not run: the endpoint does not answer")
        return False
    probe = _list_probe(client, ctx.storage.url.bucket, ctx.storage.url.key_prefix)
    ctx.run("s3.clock_skew", lambda: _check_clock(ctx, state.get("server_date"), probe))
    if probe.code == "RequestTimeTooSkewed":
        for check in later[1:]:
            ctx.skip(check, "not run: the server rejects requests signed with this machine's clock")
        return False
    if ctx.run("s3.credentials", lambda: _check_credentials(ctx, probe)).status is Status.FAIL:
        for check in later[2:]:
            ctx.skip(check, "not run: the credentials were rejected")
        return False
    if ctx.run("s3.bucket", lambda: _check_bucket(ctx, probe)).status is Status.FAIL:
        ctx.skip("s3.multipart", "not run: the bucket is not usable")
        return False
    ctx.run("s3.multipart", lambda: _check_multipart(ctx, client))
    return True
