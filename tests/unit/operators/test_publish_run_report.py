"""The pipeline's last task publishes the run report: ``publish_run_report`` (dags/areal_dag_tasks.py)
writes ``report.html`` in the run dir and logs it, with ``trace.json`` and ``sessions.jsonl`` when
present, under ``report/`` of the MLflow run (a real sqlite store); the task's log lines then end
with the report's path, the artifact URI and how to open the trace in Perfetto. ``finish_pipeline``
itself (its body, with a stand-in Airflow context) ends the run FINISHED with the report among its
artifacts, the report and its URI in ``summary.json``, and a log whose last lines say where they are."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("plotly")

DAGS = Path(__file__).resolve().parents[3] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))  # as Airflow does: the DAG folder is on sys.path

import areal_dag_tasks as tasks  # noqa: E402
from areal_dag_tasks import format_pipeline_summary, publish_run_report  # noqa: E402

from tests.fixtures.fake_run import make_run_dir  # noqa: E402


@pytest.mark.parametrize("traced", [True, False])
def test_the_report_and_traces_become_artifacts_of_the_run(store: SimpleNamespace, traced: bool) -> None:
    run = make_run_dir(store.tmp / "run", steps=4, sessions=traced, trace=traced)
    published = publish_run_report(str(run), store.hook, store.run_id)
    assert Path(published["report"]) == run.resolve() / "report.html" and Path(published["report"]).is_file()
    names = ["report.html", "trace.json", "sessions.jsonl"] if traced else ["report.html"]
    assert published["report_files"] == names
    listed = sorted(a.path for a in store.client.list_artifacts(store.run_id, "report"))
    assert listed == sorted(f"report/{name}" for name in names)
    assert published["report_artifacts"] == store.client.get_run(store.run_id).info.artifact_uri + "/report"

    lines = format_pipeline_summary({"mlflow_run_id": store.run_id, **published}).splitlines()
    tail = lines[-3:] if traced else lines[-2:]
    assert tail[0].startswith("run report:") and (run.resolve() / "report.html").as_uri() in tail[0]
    assert tail[1].startswith("MLflow artifacts:") and published["report_artifacts"] in tail[1]
    assert ("ui.perfetto.dev" in tail[-1]) is traced


def test_finish_pipeline_publishes_the_report_and_its_log_ends_with_where(
    store: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="areal.dags")
    run = make_run_dir(store.tmp / "run", steps=4)
    context = {
        "params": {"registered_model_name": "areal-policy"},
        "dag": SimpleNamespace(dag_id="areal_rl_training"),
        "run_id": "manual__1",
    }
    monkeypatch.setattr(tasks, "get_current_context", lambda: context)
    result = tasks.finish_pipeline.function(
        {"run_dir": str(run)},
        {"mlflow_run_id": store.run_id, "tracking_uri": store.uri},
        {"reward_before": 0.2, "reward_after": 0.4, "final_checkpoint": "file:///c/step_4", "summary": {}},
        [],
        {"version": "1", "aliases": ["candidate"]},
    )
    assert result["report"] == str(run.resolve() / "report.html")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["report_artifacts"] == result["report_artifacts"] and summary["mlflow_run_id"] == store.run_id
    assert "report/report.html" in [a.path for a in store.client.list_artifacts(store.run_id, "report")]
    assert store.client.get_run(store.run_id).info.status == "FINISHED"
    # the report shows the pipeline's figures (written before it)
    assert "registered model version" in (run / "report.html").read_text(encoding="utf-8")
    last = caplog.records[-1].getMessage().splitlines()
    assert last[-3].startswith("run report:") and last[-2].startswith("MLflow artifacts:")
    assert "ui.perfetto.dev" in last[-1]
