"""A check of a trace against the trace-event format, as this project writes it.

Used by the tests and by anyone who wants to know a ``trace.json`` opens: per phase, the required
keys and their types; complete events with non-negative durations and a known category; and, per
``(pid, tid)``, spans that nest (a span that starts inside another ends inside it too). The
``perfetto`` package's trace processor needs a binary it downloads at first use, which a machine
without internet cannot do, so this check is the project's own.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from areal_tasks.trace.events import CATEGORIES

__all__ = ["check_trace"]

_METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index", "process_labels"}
#: microseconds of rounding two nested spans' ends may differ by.
_SLACK_US = 0.01


def check_trace(trace: Any) -> list[str]:
    """Every problem of ``trace`` (a loaded ``trace.json``) as a line; empty when it is valid."""
    problems: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["the trace is not an object with a traceEvents list"]
    if trace.get("displayTimeUnit") not in (None, "ms", "ns"):
        problems.append(f"displayTimeUnit {trace.get('displayTimeUnit')!r} is not 'ms' or 'ns'")
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for i, event in enumerate(trace["traceEvents"]):
        where = f"event {i}"
        if not isinstance(event, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = event.get("ph")
        for key in ("pid", "tid"):
            if not isinstance(event.get(key), int):
                problems.append(f"{where}: {key} must be an integer, got {event.get(key)!r}")
        if not isinstance(event.get("name"), str) or not event.get("name"):
            problems.append(f"{where}: name must be a non-empty string")
        if ph == "M":
            if event.get("name") not in _METADATA:
                problems.append(f"{where}: unknown metadata {event.get('name')!r}")
            if not isinstance(event.get("args"), dict):
                problems.append(f"{where}: metadata needs args")
        elif ph == "X":
            if event.get("cat") not in CATEGORIES:
                problems.append(f"{where}: category {event.get('cat')!r} is not one of {sorted(CATEGORIES)}")
            ts, dur = event.get("ts"), event.get("dur")
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
                problems.append(f"{where}: ts must be a non-negative number, got {ts!r}")
                continue
            if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur < 0:
                problems.append(f"{where}: dur must be a non-negative number, got {dur!r}")
                continue
            if "args" in event and not isinstance(event["args"], dict):
                problems.append(f"{where}: args must be an object")
            if isinstance(event.get("pid"), int) and isinstance(event.get("tid"), int):
                spans[(event["pid"], event["tid"])].append((float(ts), float(ts) + float(dur), event["name"]))
        else:
            problems.append(f"{where}: phase {ph!r} is not written here (X or M)")
    for (pid, tid), items in spans.items():
        problems.extend(_nesting_problems(pid, tid, items))
    return problems


def _nesting_problems(pid: int, tid: int, items: list[tuple[float, float, str]]) -> list[str]:
    """Spans of one thread must nest: sorted by start (longer first), each lies within the open one."""
    problems: list[str] = []
    open_: list[tuple[float, float, str]] = []
    for start, end, name in sorted(items, key=lambda s: (s[0], -s[1])):
        while open_ and open_[-1][1] <= start + _SLACK_US:
            open_.pop()
        if open_ and end > open_[-1][1] + _SLACK_US:
            parent = open_[-1]
            problems.append(
                f"pid {pid} tid {tid}: {name!r} [{start}, {end}] overlaps {parent[2]!r} [{parent[0]}, {parent[1]}] "
                "without nesting in it"
            )
            continue
        open_.append((start, end, name))
    return problems
