"""The DAGs' ``resolve_job`` keeps secrets out of XCom, its log, its error and ``config.yaml``
(issue #26: its XCom ``storage_options`` went to the Airflow database and UI, and its log line
quoted the overrides); the storage check downstream gets the secret back from the environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))  # as Airflow does: the DAG folder (bundle path) is on sys.path

import areal_dag_tasks as tasks  # noqa: E402
from airflow.sdk.exceptions import AirflowFailException  # noqa: E402

SECRET = "S3CRET2XYZ"


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **params: Any) -> dict[str, Any]:
    context = {
        "params": {"config": "configs/demo_grpo.yaml", "run_dir": str(tmp_path / "run"), **params},
        "dag": SimpleNamespace(dag_id="areal_rl_training"),
        "run_id": "manual__1",
    }
    monkeypatch.setattr(tasks, "get_current_context", lambda: context)
    return tasks.resolve_job.function()


def test_secrets_stay_out_of_xcom_log_and_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    monkeypatch.setenv("AREAL_CONFIG_SECRETS", json.dumps({"storage.options.secret": SECRET}))
    job = _run(
        monkeypatch,
        tmp_path,
        storage_url="s3://bucket/prefix",
        extra_overrides=["storage.options.key=AKIAPUBLIC"],
    )
    assert job["storage_options"] == {"key": "AKIAPUBLIC", "secret": "***"}
    assert SECRET not in json.dumps(job) + caplog.text + Path(job["resolved_config"]).read_text()

    from operators.hooks.storage import StorageHook

    assert StorageHook(job["storage_url"], job["storage_options"]).options == {"key": "AKIAPUBLIC", "secret": SECRET}


def test_a_secret_param_override_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AREAL_CONFIG_SECRETS", raising=False)
    with pytest.raises(AirflowFailException, match="AREAL_CONFIG_SECRETS") as caught:
        _run(monkeypatch, tmp_path, extra_overrides=[f"storage.options.secret={SECRET}"])
    assert SECRET not in str(caught.value) and "storage.options.secret=***" in str(caught.value)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_an_invalid_config_error_quotes_no_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AREAL_CONFIG_SECRETS", json.dumps({"tracking.mlflow_uri": f"https://u:{SECRET}@h/"}))
    with pytest.raises(AirflowFailException, match="train.total_steps") as caught:
        _run(monkeypatch, tmp_path, max_steps=0)
    assert SECRET not in str(caught.value)
