"""``AReaLTrainingOperator`` against real detached jobs running a fake trainer (fake_train.py):
execute() submits a missing job, reattaches to a running one, returns a succeeded one without
training again, resubmits a failed one with recover.mode=auto; execute_complete() returns the
summary and checkpoints or raises with the reason and log tail; on_kill and a deferral timeout
cancel the job; a bad config fails before anything is submitted; the job name is deterministic."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from areal_tasks.launch.jobs import LocalJobs
from operators.exceptions import ArealAirflowError, ArealConfigError
from operators.operators.training import AReaLTrainingOperator, job_name_for
from operators.triggers.training_job import TrainingJobTrigger
from tests.unit.operators.conftest import make_context

ROOT = Path(__file__).resolve().parents[3]
CONFIG = "configs/demo_grpo.yaml"
NAME = job_name_for("areal_rl_training", "manual__2026-01-02T03:04:05+00:00", "train")


@pytest.fixture
def op_factory(jobs: LocalJobs, tmp_path: Path, fake_train_command: list[str]):
    def build(**kwargs: Any) -> AReaLTrainingOperator:
        args = {
            "task_id": "train",
            "config": CONFIG,
            "overrides": ["train.total_steps=303"],
            "jobs_root": str(jobs.root),
            "run_dir": str(tmp_path / "run"),
            "poll_interval": 0.05,
            "train_command": fake_train_command,
            "cancel_grace_s": 5.0,
            **kwargs,
        }
        return AReaLTrainingOperator(**args)

    return build


def calls(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "fake_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_job_name_is_deterministic_and_safe() -> None:
    name = job_name_for("dag", "manual__2026-01-02T03:04:05+00:00", "train")
    assert name == job_name_for("dag", "manual__2026-01-02T03:04:05+00:00", "train")
    assert name.startswith("dag__manual__2026-01-02T03_04_05_00_00__train_")
    assert name != job_name_for("dag", "manual__2026-01-02T03:04:05_00:00", "train")  # same after sanitising
    assert job_name_for("dag", "run1", "train") == "dag__run1__train"
    assert job_name_for("dag", "run1", "train", 2) == "dag__run1__train__2"
    long = job_name_for("d" * 200, "r", "t")
    assert len(long) <= 150 and long != job_name_for("d" * 199, "r", "t")


def test_missing_job_is_submitted_then_deferred(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    op = op_factory(mlflow_run_id="abc123", mlflow_tracking_uri="sqlite:////tmp/never-used.db", cancel_grace_s=60)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, TrainingJobTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.job_name == NAME and trigger.jobs_root == str(jobs.root)
    assert deferred.value.timeout == op.execution_timeout
    assert trigger.cancel_grace_s == 15.0  # capped: the triggerer bounds on_kill()
    wait_until(lambda: calls(tmp_path / "run"))
    call = calls(tmp_path / "run")[0]
    assert call["mlflow_run_id"] == "abc123"
    argv = call["argv"]
    assert argv[0] == "--config" and argv[1] == str(ROOT / CONFIG)
    assert argv[2:] == [
        "train.total_steps=303",
        f"experiment.run_dir={tmp_path / 'run'}",
        "tracking.mlflow_uri=sqlite:////tmp/never-used.db",
    ]
    assert jobs.status(NAME).state == "running" and jobs.status(NAME).attempt == 1


def test_running_job_is_reattached_not_resubmitted(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    with pytest.raises(TaskDeferred):
        op_factory().execute(make_context())
    with pytest.raises(TaskDeferred):  # the next try (a worker crash, say) finds the job running
        op_factory().execute(make_context())
    assert jobs.status(NAME).attempt == 1
    wait_until(lambda: calls(tmp_path / "run"))
    assert len(calls(tmp_path / "run")) == 1


def test_succeeded_job_returns_without_training_again(op_factory, jobs: LocalJobs, tmp_path: Path) -> None:
    op = op_factory(deferrable=False)  # submits and polls in the worker
    result = op.execute(make_context())
    run_dir = tmp_path / "run"
    checkpoint = (run_dir / "storage" / "demo_grpo" / "trial0" / "checkpoints" / "step_3").as_uri()
    assert result == {
        "job_name": NAME,
        "run_dir": str(run_dir),
        "summary": {"reward_before": 0.4, "reward_after": 0.7, "steps": 3},
        "checkpoints": [checkpoint],
        "final_checkpoint": checkpoint,
        "mlflow_run_id": None,
        "reward_before": 0.4,
        "reward_after": 0.7,
    }
    again = op_factory().execute(make_context())  # a retry after success: deferrable, but nothing to wait for
    assert again == result
    assert len(calls(run_dir)) == 1 and jobs.status(NAME).attempt == 1


def test_failed_job_is_resubmitted_with_recovery(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "fail")
    with pytest.raises(ArealAirflowError, match="exited with code 3") as failed:
        op_factory(deferrable=False).execute(make_context())
    assert "fake trainer: something broke" in str(failed.value)
    assert "recover.mode=auto" not in calls(tmp_path / "run")[0]["argv"]
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    with pytest.raises(TaskDeferred):
        op_factory().execute(make_context())
    assert jobs.status(NAME).attempt == 2
    wait_until(lambda: len(calls(tmp_path / "run")) == 2)
    assert calls(tmp_path / "run")[1]["argv"][-1] == "recover.mode=auto"


def test_cancelled_job_is_resubmitted_with_recovery(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    with pytest.raises(TaskDeferred):
        op_factory().execute(make_context())
    jobs.cancel(NAME, grace_s=5)
    monkeypatch.setenv("FAKE_TRAIN_MODE", "succeed")
    assert op_factory(deferrable=False).execute(make_context())["reward_after"] == 0.7
    assert jobs.status(NAME).attempt == 2 and calls(tmp_path / "run")[-1]["argv"][-1] == "recover.mode=auto"


def test_execute_complete_success_and_failures(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = op_factory(deferrable=False)
    op.execute(make_context())  # a real succeeded job with its summary and checkpoint
    event = {
        "status": "succeeded",
        "reason": "exited with code 0",
        "job_name": NAME,
        "run_dir": str(tmp_path / "run"),
        "exit_code": 0,
    }
    assert op_factory().execute_complete(make_context(), event)["reward_after"] == 0.7
    failed = {**event, "status": "failed", "reason": "exited with code 3", "exit_code": 3}
    with pytest.raises(ArealAirflowError, match="training job .* failed: exited with code 3") as info:
        op_factory().execute_complete(make_context(), failed)
    assert "last 30 lines" in str(info.value) and "recover.mode=auto" in str(info.value)
    with pytest.raises(ArealAirflowError, match="lost track of training job .*may still be running"):
        op_factory().execute_complete(make_context(), {**event, "status": "error", "reason": "OSError: x"})
    with pytest.raises(ArealAirflowError, match="cancelled"):
        op_factory().execute_complete(make_context(), {**event, "status": "cancelled", "reason": "cancelled"})


def test_on_kill_cancels_the_job(op_factory, jobs: LocalJobs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    op = op_factory()
    op.on_kill()  # before execute: nothing to cancel, and no error
    with pytest.raises(TaskDeferred):
        op.execute(make_context())
    op.on_kill()
    assert jobs.status(NAME).state == "cancelled"


def test_deferral_timeout_cancels_the_job(op_factory, jobs: LocalJobs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    with pytest.raises(TaskDeferred):
        op_factory().execute(make_context())
    op = op_factory()  # the task resumed on a worker after the trigger timed out
    with pytest.raises(ArealAirflowError, match="ran past execution_timeout"):
        op.resume_execution(TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, make_context())
    assert jobs.status(NAME).state == "cancelled"


def test_bad_config_fails_before_submitting_and_without_retries(op_factory, jobs: LocalJobs) -> None:
    with pytest.raises(ArealConfigError, match="not found") as missing:
        op_factory(config="configs/no_such_file.yaml").execute(make_context())
    assert isinstance(missing.value, AirflowFailException)
    with pytest.raises(ArealConfigError, match="train.total_steps"):
        op_factory(overrides=["train.total_steps=-5"]).execute(make_context())
    assert jobs.status(NAME).state == "missing"


def test_unknown_scheduler_names_the_supported_ones(op_factory) -> None:
    with pytest.raises(ArealAirflowError, match=r"'k8s' \(unknown\) .* supported schedulers: local"):
        op_factory(scheduler="k8s").execute(make_context())


def test_templated_absent_run_id_means_none(op_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = op_factory(mlflow_run_id="None", deferrable=False).execute(make_context())
    assert result["mlflow_run_id"] is None
    assert calls(tmp_path / "run")[0]["mlflow_run_id"] is None
    assert not any(a.startswith("tracking.mlflow_uri=") for a in calls(tmp_path / "run")[0]["argv"])


def test_run_dir_and_tracking_uri_given_as_overrides_are_not_repeated(op_factory, tmp_path: Path) -> None:
    run_dir = tmp_path / "given_run"
    op = op_factory(
        overrides=[f"experiment.run_dir={run_dir}", "tracking.mlflow_uri=sqlite:////tmp/a.db"],
        run_dir=None,
        mlflow_run_id="r1",
        mlflow_tracking_uri="sqlite:////tmp/b.db",
        deferrable=False,
    )
    assert op.execute(make_context())["run_dir"] == str(run_dir)
    argv = calls(run_dir)[0]["argv"]
    assert argv[2:] == [f"experiment.run_dir={run_dir}", "tracking.mlflow_uri=sqlite:////tmp/a.db"]


def test_secret_overrides_reach_the_job_through_its_environment_not_its_argv(
    op_factory, jobs: LocalJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AREAL_CONFIG_SECRETS", raising=False)
    monkeypatch.setenv("FAKE_TRAIN_MODE", "sleep")
    op = op_factory(
        overrides=[
            "train.total_steps=303",
            "storage.options.secret=S3CRET2",
            "storage.options.key=AKIAPUBLIC",
        ],
        mlflow_tracking_uri="https://user:PASS3@mlflow.example/",
    )
    with pytest.raises(TaskDeferred):
        op.execute(make_context())
    wait_until(lambda: calls(tmp_path / "run"))
    call = calls(tmp_path / "run")[0]
    argv = " ".join(call["argv"])
    assert "S3CRET2" not in argv and "PASS3" not in argv and "tracking.mlflow_uri" not in argv
    assert "storage.options.key=AKIAPUBLIC" in argv and "train.total_steps=303" in argv
    secrets = json.loads(call["secrets_env"])
    assert secrets == {
        "storage.options.secret": "S3CRET2",
        "tracking.mlflow_uri": "https://user:PASS3@mlflow.example/",
    }
    attempt = Path(jobs.status(NAME).log_path).parent
    recorded = (attempt / "job.json").read_text() + (attempt / "job.log").read_text()
    assert "S3CRET2" not in recorded and "PASS3" not in recorded


def test_a_bad_config_error_quotes_no_secret(op_factory) -> None:
    op = op_factory(overrides=["storage.options.secret=S3CRET2", "train.total_steps=0"])
    with pytest.raises(ArealConfigError, match="train.total_steps") as caught:
        op.execute(make_context())
    assert "S3CRET2" not in str(caught.value) and "storage.options.secret=***" in str(caught.value)
