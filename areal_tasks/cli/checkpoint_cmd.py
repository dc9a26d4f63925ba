"""``areal checkpoint list|inspect|verify|export``: look at, check and export the checkpoints of a run.

URL is a run's checkpoints folder (``<storage>/<experiment>/<trial>/checkpoints``, any storage URL:
path, ``file://``, ``s3://``) or one step directory in it (``.../checkpoints/step_40``).

* ``list URL`` prints one line per step directory (status, times, size, metrics); ``--json`` for JSON.
  Complete checkpoints get a cheap check (``--verify``: a deep one); a damaged one shows ``corrupt``
  and its first problem, and the rest are still listed.
* ``inspect URL [--step N]`` prints the metadata of one checkpoint (default: the one URL names, else
  the latest) as JSON.
* ``verify URL [--step N | --all]`` checks every file and every tensor item of a checkpoint (default:
  the one URL names, else the latest) against the hashes its save recorded: exit 0, or 2 naming the
  damaged file and item.
* ``export URL --hf OUT [--step N] [--engine actor] [--force]`` writes an HF model directory that plain
  ``transformers`` loads (LoRA merged), after checking what it exports. OUT must be new or empty;
  ``--force`` writes into a non-empty OUT, replacing only what an earlier export wrote there.

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
        help="list, inspect, verify and export checkpoints",
        description=(
            "Checkpoints of a run: list them, print one's metadata, check one against its recorded hashes, "
            "export one as an HF model directory."
        ),
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
    listing.add_argument(
        "--verify",
        action="store_true",
        help="check every file and tensor item (reads all data; default: a cheap check)",
    )
    listing.set_defaults(handler=run_list)

    inspect = add("inspect", "print the metadata of one checkpoint as JSON")
    inspect.add_argument(
        "--step", type=int, metavar="N", help="which checkpoint (default: URL's step, else the latest)"
    )
    inspect.set_defaults(handler=run_inspect)

    verify = add("verify", "check a checkpoint's files and tensor items against their recorded sha256")
    which = verify.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="which checkpoint (default: URL's step, else the latest)")
    which.add_argument("--all", action="store_true", help="every complete checkpoint")
    verify.add_argument("--json", action="store_true", help="print JSON instead of text")
    verify.set_defaults(handler=run_verify)

    export = add("export", "write one checkpoint as an HF model directory (LoRA merged)")
    export.add_argument(
        "--hf", required=True, metavar="OUT", help="local directory to write: new or empty (published atomically)"
    )
    export.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT: replaces only files an earlier export wrote there, keeps every other file",
    )
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
    return CheckpointManager.open(url, options or None, must_exist=True), step


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
        infos = manager.list(deep=args.verify)
        rows = [
            {
                "step": i.step,
                "dir": i.dir,
                "status": i.status,
                **({"problem": i.problem} if i.problem else {}),
                **(i.metadata.summary() if i.metadata else {}),
            }
            for i in infos
        ]
        if args.json:
            sys.stdout.write(
                json.dumps({"url": manager.url, "latest": manager.latest(), "checkpoints": rows}, indent=1) + "\n"
            )
            return 0
        sys.stdout.write(f"{manager.url}\n")
        sys.stdout.write(
            f"{'step':>8}  {'status':<11} {'completed_at':<32} {'written':>12} {'referenced':>12}  metrics\n"
        )
        for row in rows:
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(row.get("metrics", {}).items()))
            sys.stdout.write(
                f"{row['step']:>8}  {row['status']:<11} {row.get('completed_at', '-'):<32} "
                f"{row.get('bytes_written', 0):>12} {row.get('bytes_referenced', 0):>12}  {metrics}\n"
            )
            if "problem" in row:
                sys.stdout.write(f"{'':>8}  ! {row['problem']}\n")
        return 0

    return _run(body, args)


def run_inspect(args: argparse.Namespace) -> int:
    def body(args: argparse.Namespace) -> int:
        manager, step = _open(args)
        metadata = manager.metadata(_chosen_step(manager, step))
        sys.stdout.write(metadata.to_json() + "\n")
        return 0

    return _run(body, args)


def run_verify(args: argparse.Namespace) -> int:
    from areal_tasks.checkpoint.verify import verify_step

    def body(args: argparse.Namespace) -> int:
        manager, step = _open(args)
        steps = manager.layout.complete_steps() if args.all else [_chosen_step(manager, step)]
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {manager.url}")
        reports = [verify_step(manager.layout, s, deep=True) for s in steps]
        if args.json:
            out = [
                {
                    "step": r.step,
                    "ok": r.ok,
                    "files": r.files_checked,
                    "items": r.items_checked,
                    "bytes_hashed": r.bytes_hashed,
                    "problems": [p.to_dict() for p in r.problems],
                }
                for r in reports
            ]
            sys.stdout.write(json.dumps({"url": manager.url, "checkpoints": out}, indent=1) + "\n")
        else:
            sys.stdout.write(f"{manager.url}\n")
            for r in reports:
                state = "ok" if r.ok else f"DAMAGED ({len(r.problems)} problems)"
                sys.stdout.write(
                    f"step_{r.step}: {state}: {r.files_checked} files, {r.items_checked} items, "
                    f"{r.bytes_hashed} bytes hashed\n"
                )
                for problem in r.problems[:_SHOWN_PROBLEMS]:
                    sys.stdout.write(f"  ! {problem}\n")
        for report in reports:
            report.raise_if_damaged()
        return 0

    return _run(body, args)


_SHOWN_PROBLEMS = 20


def run_export(args: argparse.Namespace) -> int:
    from areal_tasks.checkpoint.export import export_hf

    def body(args: argparse.Namespace) -> int:
        manager, step = _open(args)
        chosen = _chosen_step(manager, step)
        manager.metadata(chosen)  # refuses an incomplete checkpoint with a clear message
        out = export_hf(manager.layout.storage, chosen, args.hf, engine=args.engine, force=args.force)
        sys.stdout.write(json.dumps({"step": chosen, "engine": args.engine, "hf": str(out)}) + "\n")
        return 0

    return _run(body, args)
