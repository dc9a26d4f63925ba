"""``areal storage validate URL``: pre-flight checks of a storage location, as a JSON report on stdout.

Exit 0 when every check passes (warnings allowed), 1 when one fails, 2 on a usage error (bad URL,
option or flag). S3 credentials come from the environment (``AWS_ACCESS_KEY_ID``...); the endpoint
and region from the flags or the environment.

With ``--nodes N`` (default: ``cluster.nodes`` of ``--config``, else 1) the multi-node probe runs
through ``--scheduler`` (default: ``cluster.scheduler`` of ``--config``, else ``local``; the kinds are
the registry's), one probe worker on each of the scheduler's nodes
(:class:`~areal_tasks.launch.probe_runner.SchedulerProbeRunner`), and every failure names its node
as ``node 1 (name, address)``. With ``local`` the machine has one node, and N separate processes
play the nodes (the one-machine fallback; ``--node-paths`` gives the path as each "node" sees it).
Imports of ``storage`` and the schedulers happen inside the handler (``--help`` stays instant).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from areal_tasks.launch.registry import scheduler_kinds

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

USAGE_ERROR = 2
#: most nodes the multi-node probe runs on (with the local scheduler each is a local process).
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
    validate.add_argument(
        "--nodes", type=int, metavar="N", help="nodes that will share the location (default: cluster.nodes, else 1)"
    )
    validate.add_argument(
        "--scheduler",
        choices=scheduler_kinds(),
        help="run the probe on the nodes of this scheduler (default: cluster.scheduler, else local: local "
        "processes play the nodes)",
    )
    validate.add_argument("--config", metavar="FILE", help="job YAML whose cluster section gives the nodes")
    validate.add_argument(
        "--node-paths", nargs="+", metavar="PATH", help="the location as each of the N nodes sees it (one per node)"
    )
    validate.add_argument(
        "--run-dir", metavar="DIR", help="where probe-node logs go (default: a temporary dir; the job's with --config)"
    )
    validate.add_argument("--probe-timeout-s", type=float, default=60.0, metavar="S", help="per probe round")
    validate.set_defaults(handler=run_validate)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    if args.region:
        options["region"] = args.region
    return options


def _fail(message: str, code: int = USAGE_ERROR) -> int:
    from storage.redact import redact_text

    sys.stderr.write(f"areal storage validate: error: {redact_text(message)}\n")
    return code


def run_validate(args: argparse.Namespace) -> int:
    """Validate ``args.url``; print the JSON report; 0 ok, 1 a check failed, 2 usage error."""
    from areal_tasks.errors import ConfigError, SchedulerError
    from storage.errors import StorageConfigError
    from storage.redact import redact_text
    from storage.validate import Thresholds, validate_storage

    try:
        cfg = _load_config(args.config) if args.config else None
    except ConfigError as exc:
        return _fail(str(exc))
    args.scheduler = args.scheduler or (cfg.cluster.scheduler if cfg else "local")
    if args.nodes is None:
        args.nodes = cfg.cluster.nodes if cfg else 1
    if args.nodes < 1 or args.nodes > MAX_NODES:
        return _fail(f"--nodes={args.nodes} must be " + (">= 1" if args.nodes < 1 else f"<= {MAX_NODES}"))
    if not (math.isfinite(args.probe_timeout_s) and args.probe_timeout_s > 0):
        return _fail(f"--probe-timeout-s={args.probe_timeout_s} must be > 0")
    if args.node_paths and len(args.node_paths) != args.nodes:
        return _fail(f"--node-paths needs one path per node ({args.nodes}), got {len(args.node_paths)}")
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
        return _fail(str(exc))
    try:
        if args.nodes == 1:
            report = validate_storage(args.url, options, thresholds=thresholds)
        else:
            report = _validate_multinode(args, options, thresholds)
    except (StorageConfigError, ConfigError) as exc:
        return _fail(str(exc))
    except SchedulerError as exc:  # the nodes could not be reached: no report to print
        return _fail(str(exc), code=1)
    sys.stdout.write(redact_text(report.to_json()) + "\n")
    for failure in report.failures():
        sys.stderr.write(f"FAIL {redact_text(str(failure.error()))}\n")
    return 0 if report.ok else 1


def _load_config(path: str) -> JobConfig:
    from areal_tasks.config import load_config

    return load_config(path)


def _validate_multinode(args: argparse.Namespace, options: dict[str, Any], thresholds: Any) -> Any:
    from areal_tasks.launch import LocalScheduler
    from areal_tasks.launch.probe_runner import SchedulerProbeRunner
    from storage.validate import validate_storage

    def run(runner: SchedulerProbeRunner) -> Any:
        return validate_storage(
            args.url,
            options,
            thresholds=thresholds,
            nodes=args.nodes,
            runner=runner,
            node_urls=args.node_paths,
            probe_timeout_s=args.probe_timeout_s,
        )

    if args.scheduler == "local":  # one machine: N local processes play the nodes
        with (
            tempfile.TemporaryDirectory(prefix="areal-storage-validate-") as scratch,
            LocalScheduler(args.run_dir or scratch, devices=[], handle_signals=False) as scheduler,
        ):
            return run(SchedulerProbeRunner(scheduler, emulate_nodes=True))
    with _cluster_scheduler(args) as scheduler:
        return run(SchedulerProbeRunner(scheduler))


def _cluster_scheduler(args: argparse.Namespace) -> Scheduler:
    """The ``--scheduler`` kind built (its ``from_config``) from the job's config (``--config``, else
    the defaults) set to ``--scheduler``, ``--nodes`` and ``--run-dir``."""
    import dataclasses

    from areal_tasks.config import load_config
    from areal_tasks.errors import ConfigError, SchedulerError
    from areal_tasks.launch.registry import SCHEDULERS

    overrides = [f"experiment.run_dir={args.run_dir}"] if args.run_dir else []
    job = load_config(args.config, overrides)
    job = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, scheduler=args.scheduler, nodes=args.nodes))
    cls = SCHEDULERS.get(args.scheduler)
    can_run_here = getattr(cls, "can_run_controller_here", None)
    if can_run_here is not None and not can_run_here(job):
        raise ConfigError(
            f"the {args.scheduler} scheduler cannot start the probe from this machine: run this command on a node "
            "of the cluster (inside the allocation or as a job of the cluster)"
        )
    from_config = getattr(cls, "from_config", None)
    if from_config is None:
        raise SchedulerError(f"scheduler {args.scheduler!r} has no from_config(cfg); it cannot run the probe")
    return from_config(job)
