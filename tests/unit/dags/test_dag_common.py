"""The DAGs' shared helpers: Params -> job overrides, env-driven retry settings, failure summaries."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))  # as Airflow does: the DAG folder (bundle path) is on sys.path

import areal_dag_common as common  # noqa: E402


def test_job_overrides_keep_unset_params_and_apply_extra_last() -> None:
    params = {
        "model": "tiny:qwen2",
        "dataset": None,
        "algorithm": "ppo",
        "max_steps": 23,
        "sft_steps": 0,
        "storage_url": "",
        "extra_overrides": ["actor.optimizer.lr=1e-5"],
    }
    assert common.job_overrides(params) == [
        "model.path=tiny:qwen2",
        "algorithm.name=ppo",
        "train.total_steps=23",
        "train.sft_warmup_steps=0",
        "actor.optimizer.lr=1e-5",
    ]


def test_the_scheduler_and_node_params_reach_the_cluster_section() -> None:
    """The scheduler Param is applied (it used to be shown but ignored); an empty nodes Param keeps the config's."""
    assert common.job_overrides({"scheduler": "slurm", "nodes": 2}) == ["cluster.scheduler=slurm", "cluster.nodes=2"]
    assert common.job_overrides({"scheduler": "local", "nodes": None}) == ["cluster.scheduler=local"]


def test_job_overrides_refuse_an_extra_override_without_a_value() -> None:
    with pytest.raises(ValueError, match="not a dotted key=value"):
        common.job_overrides({"extra_overrides": ["train.total_steps"]})


def test_retry_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_DAG_RETRIES", "4")
    monkeypatch.setenv("AREAL_DAG_RETRY_DELAY_S", "2.5")
    settings = common.retry_settings()
    assert settings["retries"] == 4 and settings["retry_delay"] == timedelta(seconds=2.5)
    assert settings["retry_exponential_backoff"] == 2.0 and settings["max_retry_delay"] == timedelta(minutes=10)
    monkeypatch.setenv("AREAL_DAG_RETRIES", "two")
    with pytest.raises(ValueError, match=r"\$AREAL_DAG_RETRIES='two': expected a number"):
        common.retry_settings()


def test_job_poll_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_JOB_POLL_INTERVAL_S", raising=False)
    assert common.job_poll_interval() == 10
    monkeypatch.setenv("AREAL_JOB_POLL_INTERVAL_S", "2")
    assert common.job_poll_interval() == 2
    monkeypatch.setenv("AREAL_JOB_POLL_INTERVAL_S", "0")
    with pytest.raises(ValueError, match="AREAL_JOB_POLL_INTERVAL_S"):
        common.job_poll_interval()


def test_relative_config_paths_resolve_under_the_project(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert common.resolve_config_path("configs/demo_grpo.yaml") == str(DAGS.parent / "configs" / "demo_grpo.yaml")
    monkeypatch.setenv("AREAL_PROJECT_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"Param config='configs/nope.yaml': no such file"):
        common.resolve_config_path("configs/nope.yaml")


def test_default_run_dir_is_per_dag_run_and_filesystem_safe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AREAL_RUNS_DIR", str(tmp_path))
    run_dir = common.default_run_dir("areal_rl_training", "manual__2025-01-01T00:00:00+00:00")
    assert run_dir == str(tmp_path / "areal_rl_training" / "manual__2025-01-01T00_00_00_00_00")


def _context(try_number: int, max_tries: int, task_id: str = "train") -> dict:
    ti = SimpleNamespace(
        task_id=task_id,
        map_index=-1,
        try_number=try_number,
        max_tries=max_tries,
        dag_id="areal_rl_training",
        run_id="manual__x",
        log_url="http://127.0.0.1:8080/log",
    )
    task = SimpleNamespace(retry_delay=timedelta(seconds=60), retry_exponential_backoff=2.0)
    return {
        "ti": ti,
        "task": task,
        "exception": RuntimeError("job areal__x failed: worker exited 1"),
        "params": {"config": "configs/demo_grpo.yaml", "model": None},
    }


def test_retry_summary_says_what_failed_and_that_the_job_resumes() -> None:
    text = common.failure_summary(_context(1, 2), final=False)
    assert text.splitlines()[0] == "AREAL TASK WILL RETRY: areal_rl_training.train (try 1 of 3), run manual__x"
    assert "error: RuntimeError: job areal__x failed: worker exited 1" in text
    assert "retrying in about 0:01:00 x2 per earlier retry" in text and "resumes it from its last checkpoint" in text
    assert "params: config=configs/demo_grpo.yaml" in text and "model=" not in text
    assert "log:   http://127.0.0.1:8080/log" in text


def test_final_failure_summary_says_the_run_fails(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger="areal.dags"):
        common.log_task_failure(_context(3, 2, task_id="validate_storage"))
    assert "AREAL TASK FAILED: areal_rl_training.validate_storage (try 3 of 3)" in caplog.text
    assert "no retries left: the DAG run fails" in caplog.text


@pytest.mark.parametrize("config", common.EXAMPLE_CONFIGS)
def test_every_proposed_config_loads_and_builds_its_workflow_from_any_directory(
    config: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Job config Param's proposals (the agent examples among them) are valid recipes whose
    workflow builds, its agent's relative paths found in the checkout whatever the worker's cwd."""
    from areal_tasks.api.inference import SamplingParams
    from areal_tasks.config import load_config
    from areal_tasks.rollout.workflows import WORKFLOWS, build_workflow
    from tests.unit.rollout.workflow_fakes import arith_reward, tokenizer_by_name

    assert config in common.job_params()["config"].schema["examples"]
    monkeypatch.chdir(tmp_path)  # an Airflow worker's directory is not the checkout
    cfg = load_config(common.resolve_config_path(config), [])
    workflow = build_workflow(
        cfg.rollout.workflow, tokenizer_by_name("tiny"), SamplingParams(), arith_reward, max_prompt_len=64
    )
    assert isinstance(workflow, WORKFLOWS.get(cfg.rollout.workflow.name))
    for arg in getattr(workflow, "argv", []):  # agent_command: the program and its script, found
        if "/" in arg and not Path(arg).is_absolute() and (DAGS.parent / arg).exists():
            pytest.fail(f"{arg!r} was not resolved to the checkout's copy")  # (.venv-agents: once built)


def test_the_dataset_of_an_asset_event() -> None:
    """``extra.dataset`` (a producer, the REST API) or the watcher's ``extra.payload.dataset``."""
    from areal_dag_tasks import asset_event_dataset

    assert asset_event_dataset({"dataset": "/data/a.jsonl"}) == "/data/a.jsonl"
    watcher = {"from_trigger": True, "payload": {"dataset": "/data/b.jsonl", "url": "file:///data/b.jsonl"}}
    assert asset_event_dataset(watcher) == "/data/b.jsonl"
    assert asset_event_dataset({}) is None and asset_event_dataset({"payload": "x"}) is None
