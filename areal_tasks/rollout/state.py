"""The rollout executor's statistics and its checkpointable state, read from its groups and batches.

:func:`executor_stats` is what ``RolloutExecutor.stats()`` returns (counters, rates, in-flight /
ready / capacity, the staleness histogram; see ``docs/rollout.md``). :func:`executor_state` and
:func:`load_executor_state` are the JSON-safe state: the version, the data position with the
positions of the groups not yet consumed (replayed first after a resume), the counters (those groups
left out, as if never admitted, so the admission budget is right after a resume) and the histogram.
"""

from __future__ import annotations

import time
from typing import Any

from areal_tasks.errors import RolloutError
from areal_tasks.rollout.batches import BatchTaker
from areal_tasks.rollout.groups import GroupAssembly
from areal_tasks.rollout.stats import RolloutCounters

__all__ = ["STATE_FORMAT", "executor_state", "executor_stats", "load_executor_state"]

STATE_FORMAT = 1


def executor_stats(
    groups: GroupAssembly,
    batches: BatchTaker,
    *,
    started_at: float | None,
    stopped_at: float | None,
    accepted_at_start: int,
) -> dict[str, Any]:
    """Counters, rates, in-flight/ready/capacity, the staleness bound and histogram, the last batch's staleness."""
    c = groups.counters
    counts = groups.counts()
    room, conc = groups.capacity()
    end = stopped_at if stopped_at is not None else time.monotonic()
    elapsed = end - started_at if started_at is not None else 0.0
    finished = c.accepted + c.rejected + c.filtered
    return {
        **c.to_dict(),
        "in_flight": counts["in_flight"],
        "running_samples": counts["running"],
        "ready": counts["ready"],
        "capacity": max(0, min(room, conc)),
        "version": groups.version,
        "base_version": groups.base_version,
        "paused": groups.paused,
        "staleness_bound": batches.bound,
        "samples_per_s": (c.accepted - accepted_at_start) / elapsed if elapsed > 0 else 0.0,
        "rejection_rate": (c.rejected + c.filtered) / finished if finished else 0.0,
        "window_failure_rate": groups.failures.rate,
        "staleness_hist": batches.hist.as_dict(),
        "last_batch_staleness_mean": batches.last.get("staleness_mean", 0.0),
        "last_batch_staleness_max": batches.last.get("staleness_max", 0.0),
        "late_batches": batches.late_batches,
        "error": None if groups.error is None else str(groups.error),
    }


def executor_state(groups: GroupAssembly, batches: BatchTaker) -> dict[str, Any]:
    """JSON-safe state: data position (plus unconsumed prompts to replay), counters, version."""
    pending = sorted([*groups.running.values(), *groups.ready], key=lambda g: g.seq)
    counters = RolloutCounters(**groups.counters.to_dict())
    # unconsumed groups are replayed after a resume: count them as never admitted
    counters.admitted -= sum(g.size for g in pending)
    counters.accepted -= sum(g.size for g in groups.ready)
    return {
        "format": STATE_FORMAT,
        "version": groups.version,
        "base_version": groups.base_version,
        "data": groups.data.state_dict(g.position for g in pending),
        "counters": counters.to_dict(),
        "staleness_hist": batches.hist.to_state(),
    }


def load_executor_state(groups: GroupAssembly, batches: BatchTaker, state: dict[str, Any]) -> int:
    """Restore :func:`executor_state` output (before the executor starts); returns the prompts to replay."""
    if state.get("format") != STATE_FORMAT:
        raise RolloutError(f"rollout executor state has format {state.get('format')!r}, expected {STATE_FORMAT}")
    groups.data.load_state_dict(state["data"])
    groups.counters = RolloutCounters.from_dict(state.get("counters", {}))
    groups.version = int(state["version"])
    groups.base_version = int(state.get("base_version", groups.version - groups.counters.consumed_batches))
    batches.hist.load_state(state.get("staleness_hist", {}))
    return len(state["data"].get("pending", []))
