"""The HTML run report in a real headless Chromium (tests/fixtures/browser.py; skips without one).

The report of a fake run dir (tests/fixtures/fake_run.py) is opened from its file with the network
blocked (any request leaving the file would fail the test: the page is self-contained). The test
waits for the page's script, then checks that every plot rendered: each ``.js-plotly-plot`` has
traces with points and SVG marks (paths or bar points) on screen. It then drives the episode
table's filters (status, trained-step range, reward range, reset) and compares the rows shown with
the embedded data. A full-page screenshot goes to the test's tmp dir and is copied to
``$AREAL_TEST_ARTIFACTS/report/`` (else ``runs/test-artifacts/report/``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.report import write_report
from areal_tasks.report.episodes import COLUMNS
from tests.fixtures.browser import CHROMIUM, artifacts_dir, require_chromium
from tests.fixtures.fake_run import make_run_dir

pytestmark = [pytest.mark.integration]

TIMEOUT_MS = 15_000

#: per plot on the page: its id, how many traces, points per trace, SVG marks drawn.
PLOTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map((el) => ({
  id: el.id,
  traces: el.data.length,
  points: el.data.map((t) => (t.type === 'histogram' ? t.x : t.y || []).length),
  marks: el.querySelectorAll('g.cartesianlayer path.js-line, g.cartesianlayer g.points path').length,
}))"""


def _rows_shown(page: Any) -> list[list[str]]:  # a playwright Page
    return page.eval_on_selector_all(
        "#episodes tbody tr", "(rows) => rows.map((r) => [...r.cells].map((c) => c.textContent))"
    )


@pytest.mark.timeout(120)
def test_the_report_renders_every_plot_and_its_filters_work(tmp_path: Path) -> None:
    sync_api = require_chromium()
    run = make_run_dir(tmp_path / "run", steps=10)
    report = write_report(run)
    sessions = [json.loads(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
    shot = tmp_path / "report.png"
    status_at, step_at, reward_at = COLUMNS.index("status"), COLUMNS.index("trained_step"), COLUMNS.index("reward")

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            context = browser.new_context(viewport={"width": 1300, "height": 900})
            outside: list[str] = []

            def block(route: Any) -> None:  # a playwright Route
                outside.append(route.request.url)
                route.abort()

            context.route("http*://**", block)  # the page must need no network
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.as_uri())
            page.wait_for_function("() => window.arealReport && window.arealReport.ready")

            plots = page.evaluate(PLOTS_JS)
            assert {p["id"] for p in plots} == {
                f"plot-{k}"
                for k in ("reward", "kl", "entropy", "length", "throughput", "timeline", "staleness", "sessions", "sft")
            }
            for plot in plots:
                assert plot["traces"] > 0 and all(n > 0 for n in plot["points"]), plot
                assert plot["marks"] > 0, plot  # drawn, not just data

            total = len(sessions)
            assert len(_rows_shown(page)) == total
            assert page.text_content("#episode-count").startswith(f"{total} of {total}")

            page.select_option("#f-status", "failed")
            rows = _rows_shown(page)
            assert rows and {r[status_at] for r in rows} == {"failed"}
            assert len(rows) == sum(1 for s in sessions if s["status"] == "failed")

            page.select_option("#f-status", "accepted")
            page.fill("#f-step-min", "3")
            page.fill("#f-step-max", "4")
            page.fill("#f-reward-min", "0.5")
            rows = _rows_shown(page)
            expected = [
                s for s in sessions if s["status"] == "accepted" and 3 <= s["trained_step"] <= 4 and s["reward"] >= 0.5
            ]
            assert len(rows) == len(expected) > 0
            assert all(3 <= int(r[step_at]) <= 4 and float(r[reward_at]) >= 0.5 for r in rows)

            page.click("#f-reset")
            assert len(_rows_shown(page)) == total
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    shutil.copy(shot, artifacts_dir("report") / shot.name)
    assert not errors, errors
    assert not outside, f"the report fetched {outside}"
