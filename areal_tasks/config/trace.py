"""The ``trace`` section: the perf tracer (``docs/tracing.md``) and the per-episode session log.

Torch-free. How the section reaches each process of a run: ``areal_tasks/trace/env.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from areal_tasks.config.checks import MAX_STEPS, Problems

logger = logging.getLogger(__name__)

#: the most spans one process may be asked to keep.
MAX_TRACE_EVENTS = 10**8


@dataclass
class TraceConfig:
    """Tracing of a run (``docs/tracing.md``)."""

    #: record perf spans of every process (controller, train ranks, rollout, servers, reward workers)
    #: into ``<run_dir>/trace.json`` (Chrome trace events: Perfetto, chrome://tracing).
    enabled: bool = False
    #: record the spans of every this many RL steps (1, 1 + n, 1 + 2n, ...); spans outside any step
    #: (start-up, the final evaluation) are always recorded.
    every_n_steps: int = 1
    #: the most spans each process keeps; later ones are dropped (the trace says how many).
    max_events: int = 1_000_000
    #: write the per-episode session log (one JSON line per episode's life cycle).
    sessions: bool = True


def check_trace_section(p: Problems, trace: TraceConfig) -> None:
    """Single-section rules of ``trace``."""
    p.number("trace.every_n_steps", trace.every_n_steps, low=1, cap=MAX_STEPS)
    p.number("trace.max_events", trace.max_events, low=1, cap=MAX_TRACE_EVENTS)
