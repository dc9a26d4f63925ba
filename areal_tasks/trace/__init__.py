"""Perf tracing of a run: spans of every process as Chrome trace events (Perfetto, chrome://tracing).

Turned on by ``trace.enabled`` (``docs/tracing.md``). Each process appends its spans to its own
part file under ``<run_dir>/trace/``; the controller merges them into ``<run_dir>/trace.json``.
Torch-free; instrumented code calls :func:`span` (a shared no-op when tracing is off).
"""

from areal_tasks.trace.env import configure_from_env, trace_environment
from areal_tasks.trace.merge import TRACE_FILE, merge_trace
from areal_tasks.trace.schema import check_trace
from areal_tasks.trace.tracer import NULL_SPAN, Tracer, current, flush, install, set_step, span, uninstall

__all__ = [
    "NULL_SPAN",
    "TRACE_FILE",
    "Tracer",
    "check_trace",
    "configure_from_env",
    "current",
    "flush",
    "install",
    "merge_trace",
    "set_step",
    "span",
    "trace_environment",
    "uninstall",
]
