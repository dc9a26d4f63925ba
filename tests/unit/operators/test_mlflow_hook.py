"""``MlflowHook`` against a real local MLflow store (sqlite + file artifacts in tmp_path): where the
tracking URI comes from, runs and idempotent params, checkpoint pointer models (a URL, no weights),
and registration: ``candidate`` always, ``champion`` only on a strict improvement of the gate metric
(either direction), a retry reusing its version, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

mlflow = pytest.importorskip("mlflow")

from operators.exceptions import ArealAirflowError  # noqa: E402
from operators.hooks.mlflow import MlflowHook  # noqa: E402


def test_tracking_uri_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AREAL_MLFLOW", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ArealAirflowError, match="no MLflow tracking URI.*areal_mlflow.*MLFLOW_TRACKING_URI"):
        _ = MlflowHook().tracking_uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert MlflowHook().tracking_uri == "http://from-env:5000"
    monkeypatch.setenv("AIRFLOW_CONN_AREAL_MLFLOW", "generic://mlflow-host:5001")
    assert MlflowHook().tracking_uri == "http://mlflow-host:5001"
    monkeypatch.setenv("AIRFLOW_CONN_AREAL_MLFLOW", json.dumps({"conn_type": "generic", "host": "sqlite:////x/m.db"}))
    assert MlflowHook().tracking_uri == "sqlite:////x/m.db"
    assert MlflowHook("http://explicit:1").tracking_uri == "http://explicit:1"


def test_a_uri_password_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    hook = MlflowHook("http://user:PASSWORD9@127.0.0.1:1")
    assert hook.shown_uri == "http://user:***@127.0.0.1:1"
    with pytest.raises(ArealAirflowError) as caught:
        hook.start_run("exp")
    assert "PASSWORD9" not in str(caught.value) and "user:***@127.0.0.1:1" in str(caught.value)


def test_a_redacted_uri_resolves_to_the_configured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AREAL_MLFLOW", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:PASSWORD9@mlflow.example/")
    assert MlflowHook("https://user:***@mlflow.example/").tracking_uri == "https://user:PASSWORD9@mlflow.example/"
    with pytest.raises(ArealAirflowError, match="handed over redacted") as caught:
        _ = MlflowHook("https://other:***@elsewhere.example/").tracking_uri
    assert "PASSWORD9" not in str(caught.value)


def test_runs_metrics_and_params(store: SimpleNamespace) -> None:
    hook, run_id = store.hook, store.run_id
    hook.log_params(run_id, {"model": "tiny:qwen2", "steps": 23})
    hook.log_params(run_id, {"model": "tiny:qwen2", "steps": 99, "extra": "x"})  # a retry: existing keys kept
    hook.log_metrics(run_id, {"eval/reward": 0.5, "note": "text", "flag": True, "nan": float("nan")}, step=3)
    hook.end_run(run_id)
    run = store.client.get_run(run_id)
    assert run.data.params == {"model": "tiny:qwen2", "steps": "23", "extra": "x"}
    assert run.data.metrics == {"eval/reward": 0.5}
    assert run.data.tags["areal.dag_id"] == "d" and run.info.status == "FINISHED"
    assert store.client.get_experiment(run.info.experiment_id).name == "areal-test"
    assert hook.start_run("areal-test") != run_id  # the experiment exists: reused


def test_checkpoint_model_is_a_pointer(store: SimpleNamespace) -> None:
    url = "s3://bucket/runs/exp/t0/checkpoints/step_40"
    uri = store.hook.log_checkpoint_model(store.run_id, url, {"eval/reward": 0.75, "eval/accuracy": 0.5})
    assert uri.startswith("models:/m-")
    model = store.client.get_logged_model(uri.removeprefix("models:/"))
    assert model.name == "step_40" and model.status.to_proto() == mlflow.entities.LoggedModelStatus.READY.to_proto()
    assert model.params == {"checkpoint_url": url, "step": "40"} and model.tags["areal.checkpoint_url"] == url
    assert {m.key: m.value for m in model.metrics} == {"eval/reward": 0.75, "eval/accuracy": 0.5}
    files = list(Path(model.artifact_location.removeprefix("file://")).rglob("*"))
    assert [f.name for f in files if f.is_file()] == ["pointer.json"]  # no weights
    pointer = json.loads(next(f for f in files if f.is_file()).read_text())
    assert pointer["checkpoint_url"] == url and pointer["step"] == 40 and pointer["metrics"]["eval/reward"] == 0.75
    history = store.client.get_metric_history(store.run_id, "eval/reward")
    assert [(m.step, m.value) for m in history] == [(40, 0.75)]
    # a retry of the evaluation reuses the pointer model; another checkpoint gets its own
    assert store.hook.log_checkpoint_model(store.run_id, url, {"eval/reward": 0.75}) == uri
    assert store.hook.log_checkpoint_model(store.run_id, url + "0", {"eval/reward": 0.5}) != uri
    assert len(store.client.search_logged_models(experiment_ids=[model.experiment_id])) == 2


def test_register_candidate_and_champion_gating(store: SimpleNamespace) -> None:
    hook, client = store.hook, store.client

    def evaluated(step: int, reward: float) -> str:
        return hook.log_checkpoint_model(store.run_id, f"file:///ckpt/step_{step}", {"eval/reward": reward})

    assert hook.get_champion("areal-policy") is None
    first = hook.register(evaluated(10, 0.5), "areal-policy", {"eval/reward": 0.5}, "eval/reward")
    assert first["version"] == "1" and first["champion_changed"] and first["previous_champion"] is None
    assert first["aliases"] == ["candidate", "champion"]

    worse_uri = evaluated(20, 0.4)
    worse = hook.register(worse_uri, "areal-policy", {"eval/reward": 0.4}, "eval/reward")
    assert worse["version"] == "2" and not worse["champion_changed"] and worse["aliases"] == ["candidate"]
    assert worse["champion_value"] == 0.5 and worse["previous_champion"] == "1"
    assert str(client.get_model_version_by_alias("areal-policy", "champion").version) == "1"

    tie = hook.register(evaluated(25, 0.5), "areal-policy", {"eval/reward": 0.5}, "eval/reward")
    assert not tie["champion_changed"]  # a tie keeps the champion

    better = hook.register(
        evaluated(30, 0.9),
        "areal-policy",
        {"eval/reward": 0.9, "eval/accuracy": 1.0},
        "eval/reward",
        tags={"areal.model_dir": "/runs/x/hf/step_30"},
    )
    assert better["version"] == "4" and better["champion_changed"] and better["aliases"] == ["candidate", "champion"]
    champion = hook.get_champion("areal-policy")
    assert champion["version"] == "4" and champion["checkpoint_url"] == "file:///ckpt/step_30"
    assert champion["metrics"] == {"eval/reward": 0.9, "eval/accuracy": 1.0}
    assert champion["model_dir"] == "/runs/x/hf/step_30"

    again = hook.register(worse_uri, "areal-policy", {"eval/reward": 0.4}, "eval/reward")  # a retry
    assert again["version"] == "2" and again["aliases"] == ["candidate"]
    assert len(client.search_model_versions("name='areal-policy'")) == 4


def test_lower_is_better_gate(store: SimpleNamespace) -> None:
    hook = store.hook
    a = hook.log_checkpoint_model(store.run_id, "file:///c/step_1", {"eval/loss": 2.0})
    b = hook.log_checkpoint_model(store.run_id, "file:///c/step_2", {"eval/loss": 1.0})
    assert hook.register(a, "m", {"eval/loss": 2.0}, "eval/loss", higher_is_better=False)["champion_changed"]
    assert hook.register(b, "m", {"eval/loss": 1.0}, "eval/loss", higher_is_better=False)["champion_changed"]
    assert hook.get_champion("m")["version"] == "2"


def test_register_errors_are_clear(store: SimpleNamespace) -> None:
    uri = store.hook.log_checkpoint_model(store.run_id, "file:///c/step_1", {"eval/reward": 1.0})
    with pytest.raises(ArealAirflowError, match=r"gate metric 'eval/acc' is not among .*\['eval/reward'\]"):
        store.hook.register(uri, "m", {"eval/reward": 1.0}, "eval/acc")
    with pytest.raises(ArealAirflowError, match="not a logged model URI"):
        store.hook.register("runs:/abc/model", "m", {"eval/reward": 1.0}, "eval/reward")
    with pytest.raises(ArealAirflowError, match="cannot read logged model m-doesnotexist"):
        store.hook.register("models:/m-doesnotexist", "m", {"eval/reward": 1.0}, "eval/reward")
    with pytest.raises(ArealAirflowError, match="cannot read run"):
        store.hook.log_checkpoint_model("0" * 32, "file:///c/step_1", {})


def test_log_artifacts_uploads_files_and_returns_their_uri(store: SimpleNamespace) -> None:
    files = [store.tmp / "report.html", store.tmp / "trace.json"]
    for path in files:
        path.write_text(path.name, encoding="utf-8")
    uri = store.hook.log_artifacts(store.run_id, files, "report")
    assert uri == store.client.get_run(store.run_id).info.artifact_uri + "/report"
    assert sorted(a.path for a in store.client.list_artifacts(store.run_id, "report")) == [
        "report/report.html",
        "report/trace.json",
    ]
    assert store.hook.log_artifacts(store.run_id, files[:1], "report") == uri  # a retry overwrites
