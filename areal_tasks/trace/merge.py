"""Merge a run's per-process part files (``<run_dir>/trace/*.jsonl``) into ``<run_dir>/trace.json``.

The controller calls :func:`merge_trace` at the end of a job, and on its failure; after the fact,
``python -m areal_tasks.trace.merge RUN_DIR`` does the same. A part file's last line may be cut
short (a process killed mid-write): such lines are skipped and counted in ``otherData``. Processes
on different hosts may share a pid: a part file whose pid another part file already used gets a
new one (its events are renumbered together), so every process stays one track.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from areal_tasks.errors import TraceError
from areal_tasks.trace.env import PARTS_DIR

logger = logging.getLogger(__name__)

__all__ = ["TRACE_FILE", "main", "merge_trace", "read_part"]

#: the merged trace under the run directory.
TRACE_FILE = "trace.json"


def read_part(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The events of one part file and the number of lines that were not whole JSON objects."""
    events: list[dict[str, Any]] = []
    bad = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            bad += 1
    return events, bad


def merge_trace(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Write ``<run_dir>/trace.json`` (or ``output``) from the part files; returns its path.

    Raises :class:`TraceError` when there is no part file to merge."""
    root = Path(run_dir)
    parts = sorted((root / PARTS_DIR).glob("*.jsonl"))
    if not parts:
        raise TraceError(f"no perf trace part files under {root / PARTS_DIR} (was trace.enabled true?)")
    merged: list[dict[str, Any]] = []
    used_pids: set[int] = set()
    bad_lines = 0
    processes: list[str] = []
    for part in parts:
        events, bad = read_part(part)
        bad_lines += bad
        pids = {e.get("pid") for e in events if isinstance(e.get("pid"), int)}
        remap = {}
        for pid in sorted(pids):
            new = pid
            while new in used_pids:
                new += 1 << 22  # above any Linux pid
            remap[pid] = new
            used_pids.add(new)
        for event in events:
            if event.get("pid") in remap:
                event["pid"] = remap[event["pid"]]
        merged.extend(events)
        processes.append(part.name)
    merged.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    trace = {
        "traceEvents": merged,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_dir": str(root.resolve()),
            "parts": processes,
            "skipped_lines": bad_lines,
            "clock": "epoch microseconds; per process: wall clock at start + monotonic clock (docs/tracing.md)",
        },
    }
    target = Path(output) if output is not None else root / TRACE_FILE
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
    tmp.replace(target)
    n_spans = sum(1 for e in merged if e.get("ph") == "X")
    logger.info("perf trace: %d spans of %d processes -> %s", n_spans, len(parts), target)
    if bad_lines:
        logger.warning("perf trace: %d cut-short lines of the part files were skipped", bad_lines)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m areal_tasks.trace.merge RUN_DIR [-o OUT]``."""
    parser = argparse.ArgumentParser(prog="python -m areal_tasks.trace.merge", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="the run directory (holding trace/)")
    parser.add_argument("-o", "--output", default=None, help="where to write (default: RUN_DIR/trace.json)")
    args = parser.parse_args(argv)
    try:
        path = merge_trace(args.run_dir, args.output)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
