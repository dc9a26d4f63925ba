"""The session trace's queries over a hand-written file: loading (a run dir or the file, a bad line
skipped), filters by status and step range, the staleness histogram, rejection reasons, the length
tail and the longest episodes, and keeping the last writer's lines of a step trained twice."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.errors import ConfigError
from areal_tasks.trace import (
    latest_per_step,
    length_tail,
    load_sessions,
    longest,
    rejection_reasons,
    select,
    staleness_histogram,
)


def line(episode: str, status: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"episode": episode, "status": status, "reason": None, "trained_step": None}
    base.update({"staleness": None, "n_output_tokens": 0})
    base.update(kw)
    return base


SESSIONS = [
    line("0.1.0.a", "accepted", trained_step=1, staleness=0, n_output_tokens=10),
    line("0.1.1.a", "accepted", trained_step=1, staleness=1, n_output_tokens=30),
    line("0.2.0.a", "accepted", trained_step=2, staleness=1, n_output_tokens=20),
    line("0.3.0.a", "rejected", reason="group filter: all rewards equal (0)", n_output_tokens=5),
    line("0.3.1.a", "rejected", reason="group filter: all rewards equal (0)", n_output_tokens=50),
    line("0.4.0.a", "failed", reason="ValueError: boom"),
    line("0.5.0.a", "dropped", reason="still running when the rollout executor stopped", n_output_tokens=1),
    line("0.2.0.b", "accepted", trained_step=2, staleness=2, n_output_tokens=40),
    line("0.6.0.b", "accepted", trained_step=3, staleness=0, n_output_tokens=15),
]


def write(path: Path, rows: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_load_from_the_run_dir_or_the_file_skipping_a_broken_line(tmp_path: Path) -> None:
    assert load_sessions(tmp_path) == []
    write(tmp_path / "sessions.jsonl", SESSIONS, tail='{"episode": "cut')
    assert load_sessions(tmp_path) == SESSIONS
    assert load_sessions(tmp_path / "sessions.jsonl") == SESSIONS


def test_filters_by_status_and_step_range() -> None:
    assert [s["episode"] for s in select(SESSIONS, status="failed")] == ["0.4.0.a"]
    assert len(select(SESSIONS, status=("rejected", "failed"))) == 3
    assert [s["episode"] for s in select(SESSIONS, steps=(2, None))] == ["0.2.0.a", "0.2.0.b", "0.6.0.b"]
    assert [s["episode"] for s in select(SESSIONS, status="accepted", steps=(None, 1))] == ["0.1.0.a", "0.1.1.a"]


def test_staleness_histogram_and_rejection_reasons() -> None:
    assert staleness_histogram(SESSIONS) == {0: 2, 1: 2, 2: 1}
    assert staleness_histogram(select(SESSIONS, steps=(1, 1))) == {0: 1, 1: 1}
    assert rejection_reasons(SESSIONS) == Counter({"group filter: all rewards equal (0)": 2, "ValueError: boom": 1})
    assert rejection_reasons(SESSIONS, statuses=("dropped",)) == Counter(
        {"still running when the rollout executor stopped": 1}
    )


def test_length_tail_and_longest() -> None:
    assert length_tail(SESSIONS, q=1.0) == 50
    assert length_tail(SESSIONS, q=0.5) == 15  # nearest rank: the 5th of 9
    assert length_tail([], q=0.99) == 0
    assert length_tail(select(SESSIONS, status="accepted"), q=0.99) == 40
    assert [s["episode"] for s in longest(SESSIONS, 2)] == ["0.3.1.a", "0.2.0.b"]
    with pytest.raises(ConfigError, match="q=2"):
        length_tail(SESSIONS, q=2)


def test_a_step_trained_twice_keeps_the_last_writer() -> None:
    kept = latest_per_step(SESSIONS)
    assert [s["episode"] for s in kept] == ["0.1.0.a", "0.1.1.a", "0.2.0.b", "0.6.0.b"]
