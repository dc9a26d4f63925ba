"""The episode table's rows: one compact row per ``sessions.jsonl`` record, filtered in the page.

Rows are lists (not objects) to keep a run of tens of thousands of episodes small in the HTML; at
most :data:`MAX_ROWS` are embedded (the newest), and the report says when some were left out.
"""

from __future__ import annotations

from typing import Any

#: column names, in row order (the page's table header and its filters use them).
COLUMNS = (
    "episode",
    "group",
    "status",
    "reason",
    "trained_step",
    "reward",
    "staleness",
    "admitted_version",
    "calls",
    "aborted_calls",
    "n_output_tokens",
    "duration_s",
)
MAX_ROWS = 50_000


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if value == value else None


def episode_row(record: dict[str, Any]) -> list[Any]:
    """One session record as a row of :data:`COLUMNS` (missing fields become null)."""
    calls = record.get("calls") if isinstance(record.get("calls"), list) else []
    admitted, ended = _number(record.get("admitted_t")), _number(record.get("end_t"))
    duration = round(ended - admitted, 4) if admitted is not None and ended is not None else None
    reward = _number(record.get("reward"))
    return [
        str(record.get("episode", "")),
        str(record.get("group", "")),
        str(record.get("status") or ""),
        record.get("reason") or "",
        _number(record.get("trained_step")),
        round(reward, 6) if reward is not None else None,
        _number(record.get("staleness")),
        _number(record.get("admitted_version")),
        len(calls),
        sum(1 for call in calls if isinstance(call, dict) and call.get("aborted")),
        _number(record.get("n_output_tokens")),
        duration,
    ]


def episode_rows(sessions: list[dict[str, Any]]) -> tuple[list[list[Any]], int]:
    """(rows, number left out): the last :data:`MAX_ROWS` records as rows."""
    left_out = max(len(sessions) - MAX_ROWS, 0)
    return [episode_row(record) for record in sessions[left_out:]], left_out
