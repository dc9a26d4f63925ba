"""The Airflow UI's trigger form (built from ``areal_rl_training``'s Params) in a real headless browser.

Debian's Chromium (``chromium`` on PATH, driven by Playwright; no browser is downloaded) opens the
session's live standalone, is sent to the simple auth manager's login page, signs in as admin,
opens the DAG's trigger dialog, changes the Param ``experiment_name`` in the form's "Job" section,
sets the run id under "Advanced Options" and triggers. The test then reads the DAG run back through
the REST API: it exists, with the changed value in its conf next to the Params' defaults. The run is
marked failed as soon as the scheduler has started it (so it does not train on the shared machine);
the test waits until none of its tasks is active and checks that ``train`` never ran. Screenshots
of the filled form and of the page after the trigger go to the test's tmp dir and are copied to
``runs/test-artifacts/airflow-ui/`` (the latest run's; ignored by git), or ``$AREAL_TEST_ARTIFACTS/airflow-ui/``
when that is set (tests/fixtures/browser.py).
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.airflow_server import AirflowClient, AirflowServerError, AirflowStandalone, wait_for
from tests.fixtures.browser import CHROMIUM, artifacts_dir, require_chromium

pytestmark = [pytest.mark.airflow, pytest.mark.integration]

DAG_ID = "areal_rl_training"
UI_TIMEOUT_MS = 60_000


def _run_or_none(airflow: AirflowClient, run_id: str) -> dict | None:
    try:
        return airflow.dag_run(DAG_ID, run_id)
    except AirflowServerError as exc:
        if "answered 404" in str(exc):
            return None
        raise


@pytest.mark.timeout(300)
def test_trigger_form_in_the_browser_starts_a_run_with_the_changed_param(
    airflow_server: AirflowStandalone, airflow: AirflowClient, tmp_path: Path
) -> None:
    sync_api = require_chromium()
    tag = uuid.uuid4().hex[:8]
    experiment, run_id = f"it-browser-{tag}", f"browser_{tag}"
    shots = [tmp_path / "trigger-form.png", tmp_path / "after-trigger.png"]

    started = time.monotonic()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"{airflow_server.base_url}/dags/{DAG_ID}")
            # The UI sends an anonymous visitor to the auth manager's login page through client-side
            # redirects; one of them may abort the one before it (net::ERR_ABORTED), which fails a
            # wait_for_url. Waiting for the page's elements survives that.
            page.locator('input[name="username"]').wait_for()
            assert "/auth/login" in page.url, page.url
            page.fill('input[name="username"]', airflow_server.username)
            page.fill('input[name="password"]', airflow_server.password)
            page.get_by_role("button", name="Sign in").click()
            trigger = page.get_by_test_id("trigger-dag-button")
            trigger.wait_for()
            assert page.url.split("?")[0].rstrip("/").endswith(f"/dags/{DAG_ID}"), page.url

            trigger.click()
            page.locator('button[id$=":trigger:Job"]').click()  # the Params' "Job" section
            page.locator("#element_experiment_name").fill(experiment)
            page.locator('button[id$=":trigger:advancedOptions"]').click()
            page.locator('input[name="dagRunId"]').fill(run_id)
            page.screenshot(path=str(shots[0]), full_page=True)
            page.get_by_test_id("trigger-dag-submit").click()
            try:
                run = wait_for(lambda: _run_or_none(airflow, run_id), 60, f"DAG run {run_id} to exist", poll_s=0.5)
                # do not train on the shared machine: fail the run before its first task gets far. Wait
                # until the scheduler has started it: a run marked failed while still queued can be
                # started afterwards by a scheduler loop that had already loaded it.
                wait_for(
                    lambda: _run_or_none(airflow, run_id)["state"] != "queued",
                    60,
                    f"DAG run {run_id} to leave 'queued'",
                    poll_s=0.2,
                )
                airflow.set_run_state(DAG_ID, run_id, "failed")
                page.get_by_test_id("trigger-dag-submit").wait_for(state="detached")  # the dialog closed
            finally:
                page.screenshot(path=str(shots[1]), full_page=True)
                artifacts = artifacts_dir("airflow-ui")
                for shot in shots:
                    if shot.is_file():
                        shutil.copy(shot, artifacts / shot.name)  # the latest run's
        finally:
            browser.close()
    ui_s = time.monotonic() - started

    assert run["conf"]["experiment_name"] == experiment, run["conf"]
    assert run["conf"]["config"] == "configs/demo_grpo.yaml"  # the Params' defaults came along
    assert run["run_type"] == "manual"

    def settled() -> bool:
        active = {"running", "queued", "scheduled", "deferred", "up_for_retry", "restarting"}
        return not [ti for ti in airflow.task_instances(DAG_ID, run_id) if ti["state"] in active]

    wait_for(settled, 60, f"the tasks of {run_id} to stop", poll_s=1.0)
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(DAG_ID, run_id)}
    assert states.get("train") in (None, "failed", "skipped", "upstream_failed", "removed"), states  # never trained
    # marking a run failed skips its pending tasks; on SQLite (no row locks) a scheduler loop that loaded
    # the run before the mark can still settle it as all-skipped, i.e. success: either way nothing trained
    assert airflow.dag_run(DAG_ID, run_id)["state"] in ("failed", "success"), states
    shown = artifacts_dir("airflow-ui")
    print(f"\n[test_browser_trigger] login + form + trigger in {ui_s:.1f}s; screenshots in {shown}")
