"""Tracing a run: perf spans of every process as Chrome trace events (Perfetto, chrome://tracing),
and the session trace (one record per rollout episode through its life) with its queries.

Perf spans are turned on by ``trace.enabled`` (``docs/tracing.md``): each process appends its spans
to its own part file under ``<run_dir>/trace/``; the controller merges them into
``<run_dir>/trace.json``; instrumented code calls :func:`span` (a shared no-op when tracing is off).
The session trace (``trace.sessions``) writes ``<run_dir>/sessions.jsonl``. Torch-free.
"""

from areal_tasks.trace.env import configure_from_env, trace_environment
from areal_tasks.trace.merge import TRACE_FILE, merge_trace
from areal_tasks.trace.queries import (
    latest_per_step,
    length_tail,
    load_sessions,
    longest,
    rejection_reasons,
    select,
    staleness_histogram,
)
from areal_tasks.trace.schema import check_trace
from areal_tasks.trace.sessions import EpisodeSession, SessionRecorder, note_rejection, timed_reward
from areal_tasks.trace.tracer import NULL_SPAN, Tracer, current, flush, install, set_step, span, uninstall

__all__ = [
    "NULL_SPAN",
    "TRACE_FILE",
    "EpisodeSession",
    "SessionRecorder",
    "Tracer",
    "check_trace",
    "configure_from_env",
    "current",
    "flush",
    "install",
    "latest_per_step",
    "length_tail",
    "load_sessions",
    "longest",
    "merge_trace",
    "note_rejection",
    "rejection_reasons",
    "select",
    "set_step",
    "span",
    "staleness_histogram",
    "timed_reward",
    "trace_environment",
    "uninstall",
]
