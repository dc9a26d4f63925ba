"""The convoy benchmark: a row per interval with both timings and the busy share, a JSON, bad flags refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.gil_convoy import main


def test_each_interval_is_a_row_and_the_switch_interval_is_restored(tmp_path: Path) -> None:
    out = tmp_path / "gil_convoy.json"
    saved = sys.getswitchinterval()
    report = main(["--intervals-us", "2000,100", "--seconds", "0.05", "--out", str(out)])
    assert sys.getswitchinterval() == saved
    assert [row["switch_interval_us"] for row in report["rows"]] == [2000.0, 100.0]
    for row in report["rows"]:
        assert row["op_us_alone"] > 0 and row["op_us_beside_busy_thread"] > 0 and row["busy_thread_rate_share"] > 0
        assert row["slowdown"] == pytest.approx(row["op_us_beside_busy_thread"] / row["op_us_alone"])
    assert json.loads(out.read_text())["rows"] == report["rows"]


@pytest.mark.parametrize("argv", [["--intervals-us", "0"], ["--intervals-us", ""], ["--seconds", "0"]])
def test_bad_flags_are_refused(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "x.json")])
