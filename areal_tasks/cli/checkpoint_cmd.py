"""``areal checkpoint list|inspect|export``: look at and export the checkpoints of a run.

URL is a run's checkpoints folder (``<storage>/<experiment>/<trial>/checkpoints``, any storage URL:
path, ``file://``, ``s3://``) or one step directory in it (``.../checkpoints/step_40``).

* ``list URL`` prints one line per step directory (status, times, size, metrics); ``--json`` for JSON.
* ``inspect URL [--step N]`` prints the metadata of one checkpoint (default: the one URL names, else
  the latest) as JSON.
* ``export URL --hf OUT [--step N] [--engine actor]`` writes an HF model directory that plain
  ``transformers`` loads (LoRA merged).

S3 credentials come from the environment (``AWS_ACCESS_KEY_ID``...), the endpoint and region from
the flags or the environment. Storage and checkpoint errors print one line and exit 2. Heavy imports
happen inside the handlers, so ``areal --help`` stays torch-free.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.manager import CheckpointManager

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "checkpoint",
        help="list, inspect and export checkpoints",
        description="Checkpoints of a run: list them, print one's metadata, export one as an HF model directory.",
    )
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND", parser_class=type(parser))
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument(
            "url", help="the checkpoints folder (.../<experiment>/<trial>/checkpoints) or a step_<N> in it"
        )
        cmd.add_argument("--endpoint-url", metavar="URL", help="S3 endpoint (default: AWS_ENDPOINT_URL_S3 or AWS)")
        cmd.add_argument("--region", metavar="R", help="S3 region (default: AWS_REGION or us-east-1)")
        return cmd

    listing = add("list", "list the step directories of a run: status, times, sizes, metrics")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=run_list)

    inspect = add("inspect", "print the metadata of one checkpoint as JSON")
    inspect.add_argument(
        "--step", type=int, metavar="N", help="which checkpoint (default: URL's step, else the latest)"
    )
    inspect.set_defaults(handler=run_inspect)

    export = add("export", "write one checkpoint as an HF model directory (LoRA merged)")
    export.add_argument("--hf", required=True, metavar="OUT", help="local directory to write (replaced atomically)")
    export.add_argument("--step", type=int, metavar="N", help="which checkpoint (default: URL's step, else the latest)")
    export.add_argument("--engine", default="actor", help="which engine of the checkpoint (default: actor)")
    export.set_defaults(handler=run_export)


def _split_url(url: str) -> tuple[str, int | None]:
    """(checkpoints folder URL, step named by the URL or None)."""
    from areal_tasks.checkpoint.layout import parse_step_dir

    trimmed = url.rstrip("/")
    head, _, last = trimmed.rpartition("/")
    step = parse_step_dir(last)
    return (head, step) if step is not None and head else (trimmed, None)


def _open(args: argparse.Namespace) -> tuple[CheckpointManager, int | None]:
    from areal_tasks.checkpoint.manager import CheckpointManager

    options: dict[str, Any] = {}
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    if args.region:
        options["region"] = args.region
    url, step = _split_url(args.url)
    if getattr(args, "step", None) is not None:
        step = args.step
    return CheckpointManager.open(url, options or None), step


def _run(fn: Any, args: argparse.Namespace) -> int:
    """Turn storage failures into the CLI's one-line user error (exit 2)."""
    from storage.errors import StorageError

    try:
        return fn(args)
    except StorageError as exc:
        raise CheckpointError(str(exc)) from exc


def _chosen_step(manager: CheckpointManager, step: int | None) -> int:
    if step is not None:
        return step
    latest = manager.latest()
    if latest is None:
        raise CheckpointError(f"no complete checkpoint in {manager.url}")
    return latest


def run_list(args: argparse.Namespace) -> int:
    def body(args: argparse.Namespace) -> int:
        manager, _ = _open(args)
        infos = manager.list()
        rows = [
            {"step": i.step, "dir": i.dir, "status": i.status, **(i.metadata.summary() if i.metadata else {})}
            for i in infos
        ]
        if args.json:
            sys.stdout.write(
                json.dumps({"url": manager.url, "latest": manager.latest(), "checkpoints": rows}, indent=1) + "\n"
            )
            return 0
        sys.stdout.write(f"{manager.url}\n")
        sys.stdout.write(
            f"{'step':>8}  {'status':<9} {'completed_at':<32} {'written':>12} {'referenced':>12}  metrics\n"
        )
        for row in rows:
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(row.get("metrics", {}).items()))
            sys.stdout.write(
                f"{row['step']:>8}  {row['status']:<9} {row.get('completed_at', '-'):<32} "
                f"{row.get('bytes_written', 0):>12} {row.get('bytes_referenced', 0):>12}  {metrics}\n"
            )
        return 0

    return _run(body, args)


def run_inspect(args: argparse.Namespace) -> int:
    def body(args: argparse.Namespace) -> int:
        manager, step = _open(args)
        metadata = manager.metadata(_chosen_step(manager, step))
        sys.stdout.write(metadata.to_json() + "\n")
        return 0

    return _run(body, args)


def run_export(args: argparse.Namespace) -> int:
    from areal_tasks.checkpoint.export import export_hf

    def body(args: argparse.Namespace) -> int:
        manager, step = _open(args)
        chosen = _chosen_step(manager, step)
        manager.metadata(chosen)  # refuses an incomplete checkpoint with a clear message
        out = export_hf(manager.layout.storage, chosen, args.hf, engine=args.engine)
        sys.stdout.write(json.dumps({"step": chosen, "engine": args.engine, "hf": str(out)}) + "\n")
        return 0

    return _run(body, args)
