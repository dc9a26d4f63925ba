"""Tracing a run: the session trace (one record per rollout episode through its life) and its queries."""

from areal_tasks.trace.queries import (
    latest_per_step,
    length_tail,
    load_sessions,
    longest,
    rejection_reasons,
    select,
    staleness_histogram,
)
from areal_tasks.trace.sessions import EpisodeSession, SessionRecorder, note_rejection, timed_reward

__all__ = [
    "EpisodeSession",
    "SessionRecorder",
    "latest_per_step",
    "length_tail",
    "load_sessions",
    "longest",
    "note_rejection",
    "rejection_reasons",
    "select",
    "staleness_histogram",
    "timed_reward",
]
