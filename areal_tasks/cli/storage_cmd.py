"""``areal storage validate URL``: pre-flight checks of a storage location, as a JSON report on stdout.

Exit 0 when every check passes (warnings allowed), 1 when one fails, 2 on a usage error (bad URL,
option or flag). S3 credentials come from the environment (``AWS_ACCESS_KEY_ID``...); the endpoint
and region from the flags or the environment. With ``--nodes N`` the multi-node probe runs through
the LocalScheduler, separate processes playing the nodes; ``--node-paths`` gives the path as each
node sees it. Imports of ``storage`` and ``launch`` happen inside the handler (``--help`` stays instant).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from storage.validate import NodeOutcome

logger = logging.getLogger(__name__)

USAGE_ERROR = 2
#: most nodes the multi-node probe plays (each is a local process).
MAX_NODES = 256


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "storage",
        help="validate a storage location before a run",
        description="Storage tools: pre-flight validation of file://, NFS and s3:// locations.",
    )
    sub = parser.add_subparsers(dest="storage_command", metavar="SUBCOMMAND", parser_class=type(parser))
    sub.required = True
    validate = sub.add_parser(
        "validate",
        help="check a storage URL and print a JSON report (exit 0 ok, 1 a check failed, 2 usage error)",
        description="Check that URL exists or can be created, round-trips data, has the space, speed and (S3) "
        "credentials, bucket, multipart support and clock a run needs, and is shared across --nodes.",
    )
    validate.add_argument("url", help="a path, file:///path, s3://bucket/prefix or memory://name")
    validate.add_argument("--endpoint-url", metavar="URL", help="S3 endpoint (default: AWS_ENDPOINT_URL_S3 or AWS)")
    validate.add_argument("--region", metavar="R", help="S3 region (default: AWS_REGION or us-east-1)")
    validate.add_argument("--min-free-gb", type=float, default=1.0, metavar="G", help="free space required (default 1)")
    validate.add_argument("--min-write-mbps", type=float, metavar="X", help="required write throughput, MB/s")
    validate.add_argument("--min-read-mbps", type=float, metavar="X", help="required read throughput, MB/s")
    validate.add_argument("--max-latency-ms", type=float, metavar="Y", help="allowed median small-op latency, ms")
    validate.add_argument("--max-clock-skew-s", type=float, default=30.0, metavar="S", help="S3 clock skew allowed")
    validate.add_argument("--probe-mb", type=float, default=8.0, metavar="M", help="throughput probe size, MiB")
    validate.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes that will share the location")
    validate.add_argument(
        "--node-paths", nargs="+", metavar="PATH", help="the location as each of the N nodes sees it (one per node)"
    )
    validate.add_argument("--run-dir", metavar="DIR", help="where probe-node logs go (default: a temporary dir)")
    validate.add_argument("--probe-timeout-s", type=float, default=60.0, metavar="S", help="per probe round")
    validate.set_defaults(handler=run_validate)


class SchedulerProbeRunner:
    """A ProbeRunner over a Scheduler: one worker group per probe round, one replica per node."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def run_on_nodes(
        self, command: Sequence[str], nodes: int, env: Mapping[str, str], timeout_s: float
    ) -> list[NodeOutcome]:
        from areal_tasks.api.scheduler import WorkerGroupSpec
        from areal_tasks.errors import SchedulerError
        from storage.validate import NodeOutcome

        name = f"storage-probe-{uuid.uuid4().hex[:8]}"
        spec = WorkerGroupSpec(
            name=name, command=list(command), env=dict(env), replicas=nodes, ports_per_worker=0, hide_devices=True
        )
        self.scheduler.start_group(spec)
        try:
            infos = self.scheduler.wait(name, timeout_s)
        except SchedulerError as exc:  # some node hung: report it as unfinished rather than abort the report
            logger.warning("%s", exc)
            infos = self.scheduler.status(name)
        finally:
            self.scheduler.stop_group(name, grace_s=2.0)
        outcomes = []
        for info in infos:
            finished = info.status.is_terminal and info.exit_code is not None
            output = Path(info.log_path).read_text(errors="replace") if Path(info.log_path).exists() else ""
            outcomes.append(NodeOutcome(info.rank, info.exit_code if finished else None, output))
        return outcomes


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    if args.region:
        options["region"] = args.region
    return options


def run_validate(args: argparse.Namespace) -> int:
    """Validate ``args.url``; print the JSON report; 0 ok, 1 a check failed, 2 usage error."""
    from storage.errors import StorageConfigError
    from storage.redact import redact_text
    from storage.validate import Thresholds, validate_storage

    if args.nodes < 1 or args.nodes > MAX_NODES:
        bound = ">= 1" if args.nodes < 1 else f"<= {MAX_NODES} (each node is played by a local process)"
        sys.stderr.write(f"areal storage validate: error: --nodes={args.nodes} must be {bound}\n")
        return USAGE_ERROR
    if not (math.isfinite(args.probe_timeout_s) and args.probe_timeout_s > 0):
        sys.stderr.write(f"areal storage validate: error: --probe-timeout-s={args.probe_timeout_s} must be > 0\n")
        return USAGE_ERROR
    if args.node_paths and len(args.node_paths) != args.nodes:
        sys.stderr.write(
            f"areal storage validate: error: --node-paths needs one path per node ({args.nodes}), "
            f"got {len(args.node_paths)}\n"
        )
        return USAGE_ERROR
    options = _options(args)
    try:
        if options and not args.url.startswith(("s3://", "s3a://")):
            raise StorageConfigError("--endpoint-url and --region apply to s3:// URLs only")
        thresholds = Thresholds(
            min_free_gb=args.min_free_gb,
            min_write_mbps=args.min_write_mbps,
            min_read_mbps=args.min_read_mbps,
            max_latency_ms=args.max_latency_ms,
            max_clock_skew_s=args.max_clock_skew_s,
            probe_mb=args.probe_mb,
        )
    except ValueError as exc:  # StorageConfigError is one too
        sys.stderr.write(f"areal storage validate: error: {redact_text(str(exc))}\n")
        return USAGE_ERROR
    try:
        if args.nodes == 1:
            report = validate_storage(args.url, options, thresholds=thresholds)
        else:
            report = _validate_multinode(args, options, thresholds)
    except StorageConfigError as exc:
        sys.stderr.write(f"areal storage validate: error: {redact_text(str(exc))}\n")
        return USAGE_ERROR
    sys.stdout.write(redact_text(report.to_json()) + "\n")
    for failure in report.failures():
        sys.stderr.write(f"FAIL {redact_text(str(failure.error()))}\n")
    return 0 if report.ok else 1


def _validate_multinode(args: argparse.Namespace, options: dict[str, Any], thresholds: Any) -> Any:
    from areal_tasks.launch import LocalScheduler
    from storage.validate import validate_storage

    with (
        tempfile.TemporaryDirectory(prefix="areal-storage-validate-") as scratch,
        LocalScheduler(args.run_dir or scratch, devices=[], handle_signals=False) as scheduler,
    ):
        return validate_storage(
            args.url,
            options,
            thresholds=thresholds,
            nodes=args.nodes,
            runner=SchedulerProbeRunner(scheduler),
            node_urls=args.node_paths,
            probe_timeout_s=args.probe_timeout_s,
        )
