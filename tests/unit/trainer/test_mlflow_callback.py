"""The MLflow tracking callback against a real local store (sqlite + file artifacts): config params and
YAML, stepped metrics, checkpoint pointers, eval logged models, created vs attached runs, failures
counted not raised, ConfigError for an unreachable server; ``callbacks_from_config``; and importing
``areal_tasks.trainer.tracking`` leaves mlflow unimported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

mlflow = pytest.importorskip("mlflow")

from areal_tasks.api.run_dir import MLFLOW_RUN_ID_ENV  # noqa: E402
from areal_tasks.config import load_config  # noqa: E402
from areal_tasks.config.serialize import config_to_dict, dump_config_yaml  # noqa: E402
from areal_tasks.errors import ConfigError  # noqa: E402
from areal_tasks.trainer.callbacks import ConsoleProgress, JsonlMetrics  # noqa: E402
from areal_tasks.trainer.callbacks.mlflow import (  # noqa: E402
    LATEST_CHECKPOINT_TAG,
    MLflowCallback,
    flatten_params,
    metric_key,
)
from areal_tasks.trainer.tracking import callbacks_from_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, migrated MLflow sqlite database (creating the tables takes seconds; copying is instant)."""
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fresh store per test: ``uri``, ``artifacts`` (a file URI for new experiments), ``client``."""
    db = tmp_path / "mlflow.db"
    shutil.copy(template_db, db)
    monkeypatch.chdir(tmp_path)  # MLflow's fallback artifact root is ./mlruns
    monkeypatch.delenv(MLFLOW_RUN_ID_ENV, raising=False)
    uri = f"sqlite:///{db}"
    return SimpleNamespace(
        uri=uri, artifacts=(tmp_path / "artifacts").as_uri(), client=mlflow.MlflowClient(uri), tmp=tmp_path
    )


@pytest.fixture
def cfg(tmp_path: Path):
    return load_config(
        overrides=[f"experiment.run_dir={tmp_path / 'run'}", "experiment.name=exp", "experiment.trial=t1"]
    )


def make(store: SimpleNamespace, **kwargs) -> MLflowCallback:
    kwargs.setdefault("artifact_location", store.artifacts)
    return MLflowCallback(store.uri, kwargs.pop("experiment", "exp"), **kwargs)


def artifact_text(store: SimpleNamespace, run_id: str, path: str) -> str:
    local = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=path, dst_path=str(store.tmp / "dl"), tracking_uri=store.uri
    )
    return Path(local).read_text(encoding="utf-8")


def test_created_run_logs_config_metrics_summary_and_finishes(store, cfg, monkeypatch) -> None:
    batches: list[tuple[int, int]] = []
    original = mlflow.MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        batches.append((len(metrics), len(params)))
        return original(self, run_id, metrics=metrics, params=params, tags=tags, synchronous=synchronous)

    monkeypatch.setattr(mlflow.MlflowClient, "log_batch", spy)
    cb = make(store, run_name="t1", config=cfg, log_every=2, tags={"team": "rl"})
    cb.on_start(4)
    assert cb.created_run and cb.run_id
    for step in range(1, 5):
        metrics = {"reward/mean": step / 10, "perf/tokens_per_s": 100.0 * step, "actor/kl": float("nan")}
        if step == 3:
            metrics["eval/reward"] = 0.7  # an eval step is logged even off the log_every grid
        cb.on_step(step, metrics)
    cb.on_end({"reward_after": 0.8, "steps": 4, "last_step": {"reward/mean": 0.4}, "note": "text", "ok": True})

    run = store.client.get_run(cb.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "t1"
    assert run.data.tags["team"] == "rl" and run.data.tags["areal.trial"] == "t1"
    # params: the whole flattened config, dotted keys, in batches of at most 100
    expected = flatten_params(config_to_dict(cfg))
    assert len(expected) > 100
    assert run.data.params == expected
    assert run.data.params["actor.optimizer.lr"] == str(cfg.actor.optimizer.lr)
    param_batches = [n for _, n in batches if n]
    assert sum(param_batches) == len(expected) and max(param_batches) <= 100 and len(param_batches) >= 2
    # metrics with their steps, NaN skipped
    history = store.client.get_metric_history(cb.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(2, 0.2), (3, 0.3), (4, 0.4)]
    assert [m.step for m in store.client.get_metric_history(cb.run_id, "eval/reward")] == [3]
    assert "actor/kl" not in run.data.metrics
    # summary: numeric entries (nested ones slash-joined), bools and text left out
    assert run.data.metrics["summary/reward_after"] == 0.8
    assert run.data.metrics["summary/steps"] == 4.0
    assert run.data.metrics["summary/last_step/reward/mean"] == 0.4
    assert not any(k in run.data.metrics for k in ("summary/note", "summary/ok"))
    summary = json.loads(artifact_text(store, cb.run_id, "summary/rl_summary.json"))
    assert summary["note"] == "text" and summary["steps"] == 4
    # the resolved YAML
    text = artifact_text(store, cb.run_id, "config/resolved.yaml")
    assert text == dump_config_yaml(cfg)
    assert yaml.safe_load(text)["actor"]["optimizer"]["lr"] == cfg.actor.optimizer.lr
    assert cb.errors == 0


def test_checkpoint_pointer_artifact_and_latest_tag(store) -> None:
    cb = make(store)
    cb.on_start(2)
    cb.on_checkpoint(1, "s3://bucket/ckpt/step_1", {"version": 1, "reward/mean": 0.5})
    cb.on_checkpoint(2, "s3://bucket/ckpt/step_2", {"version": 2})
    run = store.client.get_run(cb.run_id)
    assert run.data.tags[LATEST_CHECKPOINT_TAG] == "s3://bucket/ckpt/step_2"
    listed = sorted(a.path for a in store.client.list_artifacts(cb.run_id, "checkpoints"))
    assert listed == ["checkpoints/step_1.json", "checkpoints/step_2.json"]
    pointer = json.loads(artifact_text(store, cb.run_id, "checkpoints/step_1.json"))
    assert pointer == {"step": 1, "url": "s3://bucket/ckpt/step_1", "metadata": {"version": 1, "reward/mean": 0.5}}
    assert cb.errors == 0


def test_eval_with_model_dir_logs_a_logged_model(store) -> None:
    model_dir = store.tmp / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "qwen2"}', encoding="utf-8")
    (model_dir / "weights.bin").write_bytes(b"\x00" * 64)
    cb = make(store)
    cb.on_start(3)
    cb.on_eval(2, {"eval/reward": 0.25})  # no model dir: metrics only
    cb.on_eval(3, {"eval/reward": 0.5, "eval/accuracy": 0.75}, str(model_dir))

    models = store.client.search_logged_models([cb.experiment_id])
    assert [m.name for m in models] == ["step_3"]
    model = models[0]
    assert model.status == mlflow.entities.LoggedModelStatus.READY and model.source_run_id == cb.run_id
    local = Path(
        mlflow.artifacts.download_artifacts(
            f"models:/{model.model_id}", dst_path=str(store.tmp / "dl"), tracking_uri=store.uri
        )
    )
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "weights.bin"]
    run = store.client.get_run(cb.run_id)
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(model.model_id, 3)]
    history = store.client.get_metric_history(cb.run_id, "eval/reward")
    assert [(m.step, m.value) for m in history] == [(2, 0.25), (3, 0.5)]
    assert run.data.metrics["eval/accuracy"] == 0.75
    assert cb.errors == 0

    cb.on_step(3, {"eval/reward": 0.5, "reward/mean": 0.1})  # the loop also passes them to on_step: not repeated
    assert len(store.client.get_metric_history(cb.run_id, "eval/reward")) == 2
    assert [m.step for m in store.client.get_metric_history(cb.run_id, "reward/mean")] == [3]

    cb.on_eval(4, {"eval/reward": 0.6}, str(store.tmp / "missing"))  # counted, metrics still logged
    assert cb.errors == 1
    assert store.client.get_run(cb.run_id).data.metrics["eval/reward"] == 0.6


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_attached_run_stays_running(store, cfg, monkeypatch, via: str) -> None:
    experiment_id = store.client.create_experiment("pipeline", artifact_location=store.artifacts)
    upstream = store.client.create_run(experiment_id, run_name="airflow")
    run_id = upstream.info.run_id
    store.client.log_param(run_id, "experiment.trial", "set-upstream")  # params are write-once
    if via == "environment":
        monkeypatch.setenv(MLFLOW_RUN_ID_ENV, run_id)
        cb = make(store, experiment="pipeline", config=cfg)
    else:
        cb = make(store, experiment="pipeline", config=cfg, run_id=run_id)
    cb.on_start(1)
    assert cb.run_id == run_id and not cb.created_run and cb.experiment_id == experiment_id
    cb.on_step(1, {"reward/mean": 1.0})
    cb.on_end({"reward_after": 1.0})
    run = store.client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.params["experiment.trial"] == "set-upstream"
    assert run.data.params["actor.optimizer.lr"] == str(cfg.actor.optimizer.lr)
    assert run.data.metrics["reward/mean"] == 1.0 and run.data.metrics["summary/reward_after"] == 1.0
    assert len(store.client.search_runs([experiment_id])) == 1
    assert cb.errors == 0
    cb.fail("late failure")  # an attached run keeps its status; the reason is tagged
    run = store.client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.tags["areal.failure_reason"] == "late failure"


def test_fail_ends_a_created_run_failed(store) -> None:
    cb = make(store)
    cb.on_start(5)
    cb.on_step(1, {"reward/mean": 0.1})
    cb.fail("rollout failed before step 2")
    run = store.client.get_run(cb.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["areal.failure_reason"] == "rollout failed before step 2"
    cb.on_end({})  # already ended: the status stays
    assert store.client.get_run(cb.run_id).info.status == "FAILED"


def test_unreachable_server_raises_config_error_quickly(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.delenv(MLFLOW_RUN_ID_ENV, raising=False)
    cb = MLflowCallback("http://127.0.0.1:1", "exp")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"tracking\.mlflow_uri.*127\.0\.0\.1:1"):
        cb.on_start(1)
    assert time.monotonic() - started < 30
    assert cb.run_id is None
    cb.on_step(1, {"reward/mean": 1.0})  # without a run every call is a no-op
    cb.on_end({})


def test_a_password_in_the_uri_is_not_in_the_error(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.delenv(MLFLOW_RUN_ID_ENV, raising=False)
    cb = MLflowCallback("http://user:PASSWORD9@127.0.0.1:1", "exp")
    with pytest.raises(ConfigError) as caught:
        cb.on_start(1)
    assert "PASSWORD9" not in str(caught.value) and "user:***@127.0.0.1:1" in str(caught.value)


def test_a_redacted_uri_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="placeholder.*AREAL_CONFIG_SECRETS"):
        MLflowCallback("https://user:***@mlflow.example/", "exp")


def test_secrets_of_the_config_reach_neither_params_nor_the_artifact(store, tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO")
    uri = f"{store.uri}?token=SQLTOKEN77"  # sqlite ignores the query: a secret MLflow still works with
    cfg = load_config(
        overrides=[
            f"experiment.run_dir={tmp_path / 'run'}",
            "experiment.name=exp",
            f"tracking.mlflow_uri={uri}",
            "storage.options.secret=S3CRET88",
        ],
        environ={},
    )
    cb = MLflowCallback(uri, "exp", config=cfg, artifact_location=store.artifacts)
    cb.on_start(1)
    cb.on_end({})
    run = store.client.get_run(cb.run_id)
    shown = json.dumps(run.data.params) + artifact_text(store, cb.run_id, "config/resolved.yaml") + caplog.text
    assert "SQLTOKEN77" not in shown and "S3CRET88" not in shown
    assert run.data.params["storage.options.secret"] == "***"
    assert run.data.params["tracking.mlflow_uri"].endswith("?token=***")


def test_unknown_run_id_raises_config_error(store) -> None:
    with pytest.raises(ConfigError, match=MLFLOW_RUN_ID_ENV):
        make(store, run_id="0123456789abcdef").on_start(1)


def test_failures_mid_run_are_counted_not_raised(store, monkeypatch) -> None:
    cb = make(store)
    cb.on_start(2)

    def broken(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("server went away")

    monkeypatch.setattr(cb._client, "log_batch", broken)
    monkeypatch.setattr(cb._client, "log_artifact", broken)
    monkeypatch.setattr(cb._client, "set_terminated", broken)
    cb.on_step(1, {"reward/mean": 0.5})
    assert cb.errors == 1
    cb.on_checkpoint(1, "file:///ckpt/1", {})  # artifact fails, the tag still lands
    assert cb.errors == 2
    assert store.client.get_run(cb.run_id).data.tags[LATEST_CHECKPOINT_TAG] == "file:///ckpt/1"
    cb.on_end({"reward_after": 1.0})  # metrics, artifact and termination fail
    assert cb.errors == 5


def test_flatten_params_respects_mlflow_limits(caplog) -> None:
    tree = {
        "a": {"b": {"c": 1e-6}, "flag": True, "none": None, "items": [1, 2], "empty": {}},
        "long": "x" * 7000,
        "k" * 300: 1,
        "bad key!": 2,
        "s": "text",
    }
    params = flatten_params(tree)
    assert params["a.b.c"] == "1e-06"
    assert params["a.flag"] == "true" and params["a.none"] == "null"
    assert params["a.items"] == "[1, 2]" and params["a.empty"] == "{}"
    assert params["s"] == "text"
    assert len(params["long"]) == 6000
    assert "k" * 300 not in params and "bad key!" not in params
    assert "truncating" in caplog.text and "skipping" in caplog.text


def test_metric_key_sanitizes() -> None:
    assert metric_key("reward/mean") == "reward/mean"
    assert metric_key("rollout/n(ok)") == "rollout/n_ok_"
    assert metric_key("/a//b") == "a/b"
    assert metric_key("..") is None and metric_key("") is None


def test_callbacks_from_config(tmp_path: Path) -> None:
    base = [f"experiment.run_dir={tmp_path}", "experiment.name=exp", "experiment.trial=t7"]
    cbs = callbacks_from_config(load_config(overrides=base), tmp_path)
    assert [type(cb) for cb in cbs] == [ConsoleProgress, JsonlMetrics]
    assert cbs[1].path == tmp_path / "rl_metrics.jsonl"

    cfg = load_config(overrides=[*base, "tracking.jsonl=false"])
    assert [type(cb) for cb in callbacks_from_config(cfg, tmp_path, console=False)] == []

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(overrides=[*base, f"tracking.mlflow_uri={uri}", "tracking.log_every=5"])
    cbs = callbacks_from_config(cfg, tmp_path, console=False)
    assert [type(cb) for cb in cbs] == [JsonlMetrics, MLflowCallback]
    ml = cbs[1]
    assert (ml.tracking_uri, ml.experiment, ml.run_name, ml.log_every, ml.config) == (uri, "exp", "t7", 5, cfg)

    cfg = load_config(overrides=[*base, f"tracking.mlflow_uri={uri}", "tracking.mlflow_experiment=other"])
    assert callbacks_from_config(cfg, tmp_path, console=False)[-1].experiment == "other"


def test_importing_tracking_does_not_import_mlflow() -> None:
    code = (
        "import sys\n"
        "import areal_tasks.trainer.tracking\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
