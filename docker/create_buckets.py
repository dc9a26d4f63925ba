"""Create S3 buckets, idempotently: the one-shot ``s3-init`` service of docker-compose.yaml.

``python create_buckets.py BUCKET [BUCKET ...]`` waits until the S3 endpoint answers (up to
``S3_WAIT_S`` seconds, default 60), creates each bucket that does not exist yet, and checks that
every bucket is reachable afterwards. The endpoint is ``S3_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``);
the credentials and region are the standard ``AWS_*`` variables. It speaks plain S3 through botocore,
so it works against SeaweedFS, MinIO or AWS alike. Exit status 0 only if every bucket exists.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import botocore.config
import botocore.session
from botocore.exceptions import BotoCoreError, ClientError

logger = logging.getLogger("create_buckets")

# Error codes that mean "the bucket is already there" (ours, or, for the second one, possibly not ours:
# the head_bucket check afterwards tells which).
_EXISTS = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}


def _client():
    endpoint = os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=30)
    return botocore.session.get_session().create_client("s3", endpoint_url=endpoint, region_name=region, config=config)


def _wait_for_endpoint(client, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.list_buckets()
            return
        except ClientError:
            raise  # the server answered: wrong credentials and the like are not worth waiting for
        except BotoCoreError as exc:
            if time.monotonic() > deadline:
                endpoint = client.meta.endpoint_url
                raise SystemExit(f"S3 endpoint {endpoint} did not answer within {timeout_s:.0f}s: {exc}") from exc
            logger.info("waiting for %s: %s", client.meta.endpoint_url, exc)
            time.sleep(2)


def create_buckets(names: list[str], *, wait_s: float = 60.0) -> None:
    """Create every bucket in ``names`` that does not exist, then check each one is reachable."""
    client = _client()
    _wait_for_endpoint(client, wait_s)
    for name in names:
        try:
            client.create_bucket(Bucket=name)
            logger.info("created bucket %s", name)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in _EXISTS:
                raise SystemExit(f"cannot create bucket {name!r} at {client.meta.endpoint_url}: {code} {exc}") from exc
            logger.info("bucket %s already exists", name)
        try:
            client.head_bucket(Bucket=name)
        except ClientError as exc:
            raise SystemExit(f"bucket {name!r} exists but is not reachable with these credentials: {exc}") from exc


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    names = [name for name in argv if name]
    if not names:
        print("usage: create_buckets.py BUCKET [BUCKET ...]", file=sys.stderr)
        return 2
    try:
        create_buckets(names, wait_s=float(os.environ.get("S3_WAIT_S", "60")))
    except ClientError as exc:
        print(f"S3 refused the request: {exc}", file=sys.stderr)
        return 1
    print("buckets ready: " + ", ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
