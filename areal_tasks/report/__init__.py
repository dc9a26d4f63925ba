"""The HTML run report: one self-contained file (plotly.js inlined) from a run directory.

``areal report RUN_DIR`` and the pipeline's last task write it as ``<run_dir>/report.html``:
the run's summary, reward / KL / entropy / length curves, throughput, the per-step timeline
(rollout wait, training, weight update), the staleness histogram, a filterable episode table
(from the session tracer's ``sessions.jsonl``) and how to open the perf trace (``trace.json``) in
Perfetto. Missing inputs are said in the page instead of plotted. This package imports plotly only
when a report is rendered, never torch. Reference: docs/tracing.md (the run report).
"""

from __future__ import annotations

from pathlib import Path

from areal_tasks.report.data import REPORT_FILE, SESSIONS_FILE, TRACE_FILE, RunData, load_run

__all__ = ["REPORT_FILE", "SESSIONS_FILE", "TRACE_FILE", "RunData", "load_run", "write_report"]


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` (default ``<run_dir>/report.html``); returns its path.

    plotly loads here, on the first report, so importing this package stays light."""
    from areal_tasks.report.html import write_report as _write

    return _write(run_dir, out)
