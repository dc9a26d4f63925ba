"""Pre-flight storage validation: :func:`validate_storage` runs every check that fits the URL and
returns a :class:`ValidationReport` (JSON via ``to_json()``); nothing here raises for a failed check.

Check families, one module each: ``local`` (path, filesystem type, free space), ``s3`` (endpoint,
clock skew, credentials, bucket, multipart), ``common`` (round trip with a content hash, throughput
and latency) and ``multinode`` (a probe written by each node is read by every other, through the
caller's :class:`ProbeRunner`). The ``areal storage validate`` command wraps this.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from storage.errors import StorageConfigError
from storage.retry import RetryPolicy
from storage.storage import Storage
from storage.url import parse_url
from storage.validate.common import check_round_trip, check_throughput, cleanup
from storage.validate.context import CheckContext
from storage.validate.local import check_filesystem, check_free_space, check_path
from storage.validate.multinode import run_multinode_checks
from storage.validate.report import CheckResult, Status, Thresholds, ValidationReport
from storage.validate.runner import NodeOutcome, ProbeRunner
from storage.validate.s3 import run_s3_checks

__all__ = [
    "CheckResult",
    "NodeOutcome",
    "ProbeRunner",
    "Status",
    "Thresholds",
    "ValidationReport",
    "validate_storage",
]

#: validation reports failures quickly: one retry at most.
VALIDATION_RETRY = RetryPolicy(attempts=2, initial_delay_s=0.2)


def _probe_options(storage: Storage, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Options for the probe processes: the caller's plus the S3 settings resolved from the environment."""
    out = dict(options or {})
    if storage.kind == "s3":
        fs = storage.fs
        resolved = {
            "endpoint_url": fs.endpoint_url,
            "region": fs.client_kwargs.get("region_name"),
            "key": fs.key,
            "secret": fs.secret,
            "token": fs.token,
        }
        for name, value in resolved.items():
            if value is not None and name not in out:
                out[name] = value
    return out


def validate_storage(
    url: str | os.PathLike[str],
    options: Mapping[str, Any] | None = None,
    *,
    thresholds: Thresholds | None = None,
    nodes: int = 1,
    runner: ProbeRunner | None = None,
    node_urls: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    probe_timeout_s: float = 60.0,
) -> ValidationReport:
    """Check that ``url`` is usable for a run on ``nodes`` nodes; see the module docstring.

    ``node_urls``: the location as each node sees it (defaults to ``url`` for all). Raises
    StorageConfigError only for unusable input (bad URL or option, ``nodes > 1`` without a runner).
    """
    if nodes < 1:
        raise StorageConfigError(f"nodes={nodes!r} must be >= 1")
    if nodes > 1 and runner is None:
        raise StorageConfigError("a multi-node check needs a ProbeRunner to start the probe on every node")
    if node_urls is not None:
        if nodes < 2 or len(node_urls) != nodes:
            raise StorageConfigError(f"node paths: give one per node ({nodes}), or none; got {len(node_urls)}")
        node_urls = [str(parse_url(u)) for u in node_urls]
    storage = Storage.from_url(url, options, env=env, retry=VALIDATION_RETRY)
    report = ValidationReport(url=str(storage.url), kind=storage.kind, nodes=nodes, storage=storage.describe())
    ctx = CheckContext(storage, socket.gethostname(), thresholds or Thresholds(), report, nodes, clock=clock)

    ready = True
    if storage.kind == "file":
        ready = ctx.run("local.path", lambda: check_path(ctx)).status is not Status.FAIL
        if ready:
            ctx.run("local.filesystem", lambda: check_filesystem(ctx))
            ctx.run("local.free_space", lambda: check_free_space(ctx))
    elif storage.kind == "s3":
        ready = run_s3_checks(ctx)

    data_ok = False
    if ready:
        data_ok = ctx.run("storage.round_trip", lambda: check_round_trip(ctx)).status is Status.PASS
        if data_ok:
            ctx.run("storage.throughput", lambda: check_throughput(ctx))
        else:
            ctx.skip("storage.throughput", "not run: the round trip failed")
        cleanup(ctx)
    else:
        for check in ("storage.round_trip", "storage.throughput"):
            ctx.skip(check, "not run: the location is not usable (see the failures above)")

    if nodes > 1:
        if data_ok:
            urls = list(node_urls) if node_urls else [str(storage.url)]
            assert runner is not None
            run_multinode_checks(ctx, runner, urls, _probe_options(storage, options), timeout_s=probe_timeout_s)
        else:
            ctx.skip("multinode.visibility", "not run: this node cannot use the location")
    return report
