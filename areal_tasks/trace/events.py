"""Chrome trace-event records (the JSON that Perfetto and chrome://tracing open).

Only two phases are written: complete events (``"ph": "X"``: a span with ``ts`` and ``dur`` in
microseconds) and metadata events (``"ph": "M"``: ``process_name``, ``thread_name`` and their sort
indices). The format's reference: "Trace Event Format" (Google, the ``catapult`` project).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CATEGORIES", "complete_event", "metadata_event"]

#: the categories spans use (``cat``); :func:`areal_tasks.trace.check_trace` accepts these only.
CATEGORIES = frozenset({"train", "rollout", "weights", "server", "checkpoint", "eval", "generate", "reward"})


def complete_event(
    name: str, cat: str, ts_us: float, dur_us: float, pid: int, tid: int, args: dict[str, Any] | None
) -> dict[str, Any]:
    """One span (``"ph": "X"``)."""
    event: dict[str, Any] = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": round(ts_us, 3),
        "dur": round(max(dur_us, 0.0), 3),
        "pid": pid,
        "tid": tid,
    }
    if args:
        event["args"] = args
    return event


def metadata_event(kind: str, pid: int, tid: int, value: str | int) -> dict[str, Any]:
    """``process_name`` / ``thread_name`` (``args.name``) or ``*_sort_index`` (``args.sort_index``)."""
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}
