"""The tracer overhead benchmark's per-span mode: three costs, a JSON, no process started."""

from __future__ import annotations

import json
from pathlib import Path

from areal_tasks import trace
from benchmarks.trace_overhead import main


def test_micro_mode_times_the_three_cases_and_leaves_no_tracer(tmp_path: Path) -> None:
    out = tmp_path / "trace_overhead.json"
    result = main(["--micro", "--spans", "2000", "--out", str(out)])
    assert set(result["per_span"]) == {"off_ns", "on_ns", "not_sampled_ns"}
    assert all(v > 0 for v in result["per_span"].values())
    assert json.loads(out.read_text())["per_span"] == result["per_span"]
    assert trace.current() is None
