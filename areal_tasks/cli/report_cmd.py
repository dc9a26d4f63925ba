"""``areal report RUN_DIR [--out FILE]``: the run's self-contained HTML report.

Writes one HTML file (default ``<run_dir>/report.html``; plotly.js inlined, so it opens offline)
with the run's summary, training curves, throughput, step timeline, staleness histogram, episode
table and how to open ``trace.json`` in Perfetto, and prints its path. Exit codes: 0 written; 2 the
directory is not a run dir or the file cannot be written. A partial run (metrics only) still gets a
report. plotly is imported inside the handler, so ``areal --help`` stays light and torch-free.
Reference: docs/tracing.md (the run report).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a run's self-contained HTML report (curves, timeline, staleness, episodes, trace link)",
        description=(
            "Write one self-contained HTML file of a run directory: summary, reward/KL/entropy/length curves, "
            "throughput, per-step timeline, staleness histogram, a filterable episode table (sessions.jsonl) and "
            "how to open trace.json in Perfetto."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the job's run dir (experiment.run_dir), e.g. runs/latest")
    parser.add_argument("--out", default=None, metavar="FILE", help="where to write it (default RUN_DIR/report.html)")
    parser.set_defaults(handler=run_report_cmd)


def run_report_cmd(args: argparse.Namespace) -> int:
    """Write the report and print where it is; a ReportError becomes exit 2 in :func:`areal_tasks.cli.main`."""
    from areal_tasks.report import write_report

    path = write_report(args.run_dir, args.out)
    print(f"report: {path}")
    print(f"open it: file://{path.resolve()}")
    return 0
