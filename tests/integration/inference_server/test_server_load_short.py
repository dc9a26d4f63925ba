"""The server load test in its short form (issue #26, item 8): a few clients for a few seconds.

Runs ``benchmarks/server_load.py``'s ``main`` against its own ``areal serve`` and checks the
report's structure and the properties a hardened server keeps under valid and hostile load: no
5xx, alive at the end, its queue drained once the clients are gone (a disconnected client's work
is aborted), every invalid class answered with a 4xx, memory growth bounded, a bounded stop after
SIGTERM. No timed assertion: the figures go to docs/benchmarks.md from the full-minute run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

RSS_GROWTH_MIB = 256


def test_short_load_run_keeps_the_server_sound(tiny_qwen2: Path, tmp_path: Path) -> None:
    from load_requests import KINDS
    from server_load import main

    out = tmp_path / "load.json"
    report = main(
        [
            "--model",
            str(tiny_qwen2),
            "--duration-s",
            "8",
            "--clients",
            "6",
            "--baseline-requests",
            "10",
            "--drain-timeout-s",
            "60",
            "--out",
            str(out),
        ]
    )
    assert out.is_file()
    for key in ("status_by_kind", "latency_unloaded_s", "latency_loaded_s", "rss_mib", "health_s", "n_429"):
        assert key in report
    assert report["n_5xx"] == 0, report["status_by_kind"]
    assert report["unexpected_by_kind"] == {}, report["unexpected_by_kind"]
    assert report["alive_at_end"] is True
    assert report["drain_s"] is not None, "running or queued requests stayed after every client was gone"
    assert report["stop_s"] is not None and not report["sigkill_needed"], "SIGTERM did not stop the server"
    assert report["rss_mib"]["growth"] is not None and report["rss_mib"]["growth"] < RSS_GROWTH_MIB
    assert report["latency_unloaded_s"]["p50"] is not None and report["valid_ok"] > 0
    seen = set(report["status_by_kind"])
    assert {k.name for k in KINDS if k.valid} <= seen
