"""``areal report``: the HTML run report from a fake run dir (tests/fixtures/fake_run.py).

Every figure is present with data points; a run without ``sessions.jsonl`` or ``trace.json`` says
so in the page instead; a metrics-only run still renders; a directory that is not a run dir exits
2 with a message; the page is self-contained (no script, stylesheet or image fetched from a URL);
``areal train`` writes the report after the job.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from areal_tasks.cli import main
from areal_tasks.report import load_run, write_report
from areal_tasks.report.episodes import COLUMNS
from tests.fixtures.fake_run import make_run_dir

EXPECTED = ("reward", "kl", "entropy", "length", "throughput", "timeline", "staleness", "sessions", "sft")


def _embedded(page: str, element_id: str) -> object:
    found = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.DOTALL)
    assert found, element_id
    return json.loads(found.group(1))


def _points(trace: dict) -> int:
    values = trace.get("y") if trace.get("type") != "histogram" else trace.get("x")
    return len(values or [])


def test_every_figure_is_there_with_data(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", steps=12)
    path = write_report(run)
    assert path == run.resolve() / "report.html"
    page = path.read_text(encoding="utf-8")
    figures = _embedded(page, "figures-data")
    assert set(figures) == set(EXPECTED)
    for key, fig in figures.items():
        assert f'id="plot-{key}"' in page
        assert fig["data"] and all(_points(trace) > 0 for trace in fig["data"]), key
    names = {trace["name"] for trace in figures["kl"]["data"]}
    assert names == {"actor/approx_kl", "kl_ref/mean"}
    assert [t["name"] for t in figures["timeline"]["data"]][:3] == ["waiting for rollouts", "training", "weight update"]
    assert len(figures["timeline"]["data"][0]["x"]) == 12
    assert figures["staleness"]["data"][0]["name"] == "episodes (sessions.jsonl)"
    assert {t["name"] for t in figures["sessions"]["data"]} == {"accepted", "rejected", "failed", "dropped"}
    assert sum(len(t["y"]) for t in figures["sessions"]["data"]) == 8 * 12
    table = _embedded(page, "episodes-data")
    assert table["columns"] == list(COLUMNS) and len(table["rows"]) == 8 * 12
    assert {row[COLUMNS.index("status")] for row in table["rows"]} == {"accepted", "rejected", "failed", "dropped"}
    assert "fake_grpo / trial0" in page and "0.270 -&gt; 0.520" in page
    assert "ui.perfetto.dev" in page and str(run.resolve() / "trace.json") in page
    assert 'data-note="' not in page  # nothing missing


def test_missing_sessions_and_trace_are_said_not_plotted(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", sessions=False, trace=False)
    page = write_report(run).read_text(encoding="utf-8")
    assert 'data-note="episodes"' in page and "sessions.jsonl is not in this run dir" in page
    assert 'data-note="trace"' in page and "trace.enabled: true" in page
    figures = _embedded(page, "figures-data")
    # staleness falls back to the per-step metric, and the note says so
    assert figures["staleness"]["data"][0]["name"] == "steps (staleness/mean)"
    assert 'data-note="staleness"' in page
    assert "sessions" not in figures and 'data-note="sessions"' in page
    assert _embedded(page, "episodes-data") == {"rows": None}


def test_staleness_falls_back_to_the_executors_histogram(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", sessions=False)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "executor": {"staleness_hist": {"0": 50, "2": 7}}}))
    figures = _embedded(write_report(run).read_text(encoding="utf-8"), "figures-data")
    trace = figures["staleness"]["data"][0]
    assert trace["name"] == "trained samples (summary.json)" and trace["x"] == [0, 2] and trace["y"] == [50, 7]


def test_a_metrics_only_run_still_renders(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", metrics_only=True, steps=3)
    with (run / "rl_metrics.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"step": 4, "reward/me')  # a half-written last line of a live job
    data = load_run(run)
    assert len(data.rl_metrics) == 3 and data.skipped_lines == {"rl_metrics.jsonl": 1}
    page = write_report(run, tmp_path / "out.html").read_text(encoding="utf-8")
    figures = _embedded(page, "figures-data")
    assert {"reward", "kl", "timeline", "staleness"} <= set(figures)
    assert "sft" not in figures and 'data-note="sft"' in page
    assert "summary.json" in page and "skipped lines of rl_metrics.jsonl" in page


class _Refs(HTMLParser):
    """Every src/href attribute of the page's elements (script bodies are not markup to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [(tag, name, value or "") for name, value in attrs if name in ("src", "href")]


def test_the_page_fetches_nothing(tmp_path: Path) -> None:
    page = write_report(make_run_dir(tmp_path / "run")).read_text(encoding="utf-8")
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js is inlined
    parser = _Refs()
    parser.feed(page)
    assert not [ref for ref in parser.refs if ref[0] in ("script", "link", "img", "iframe", "source")], parser.refs
    # the only reference at all is the anchor to the Perfetto UI
    assert parser.refs == [("a", "href", "https://ui.perfetto.dev")]
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)


def test_cli_writes_the_report_and_prints_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run_dir(tmp_path / "run", steps=4)
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert out.is_file() and str(out) in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_not_a_run_dir_exits_2_with_a_message(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x"
    if kind == "empty":
        target.mkdir()
    elif kind == "file":
        target.write_text("hi", encoding="utf-8")
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert str(target) in err and ("not a run dir" in err or "not a directory" in err), err
    assert not (target / "report.html").exists()


def test_an_unwritable_output_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run_dir(tmp_path / "run", steps=2, sessions=False)
    assert main(["report", str(run), "--out", str(tmp_path / "no" / "such" / "r.html")]) == 2
    assert "cannot write the report" in capsys.readouterr().err


def test_areal_train_writes_the_report_after_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import areal_tasks.trainer.rl as rl

    run_dir = tmp_path / "run"
    monkeypatch.setattr(rl, "run_train", lambda cfg: make_run_dir(Path(cfg.experiment.run_dir), steps=3) and {})
    monkeypatch.setattr(rl, "format_summary", lambda summary: "table")
    config = Path(__file__).resolve().parents[3] / "configs" / "demo_grpo.yaml"
    assert main(["train", "--config", str(config), f"experiment.run_dir={run_dir}"]) == 0
    assert (run_dir / "report.html").is_file()
    assert f"run report: {(run_dir / 'report.html').resolve().as_uri()}" in capsys.readouterr().out


def test_markup_in_the_data_cannot_break_the_page(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", steps=2)
    lines = (run / "sessions.jsonl").read_text().splitlines()
    evil = {**json.loads(lines[0]), "episode": "</script><script>alert(1)</script>", "reason": "<!--<script>"}
    (run / "sessions.jsonl").write_text("\n".join([json.dumps(evil), *lines[1:]]) + "\n")
    page = write_report(run).read_text(encoding="utf-8")
    assert "alert(1)</script>" not in page and "<!--<script>" not in page
    assert _embedded(page, "episodes-data")["rows"][0][0] == evil["episode"]
