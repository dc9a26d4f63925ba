"""The run's own side effects as callbacks, on fakes: the evaluation (starting policy, every
``evaluation.freq_steps`` steps into the step's metrics, the final policy into the summary), the
checkpoint (every ``saver.freq_steps`` and the last step, ``on_checkpoint`` only for a complete save,
the manager closed at the end) and the summary (the run's facts, ``rl_summary.json``); and the
list ``callbacks_from_config`` builds around the loggers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_tasks.trainer.callbacks import CallbackList, ConsoleProgress, JsonlMetrics
from areal_tasks.trainer.callbacks.checkpoint import CheckpointCallback
from areal_tasks.trainer.callbacks.evaluation import EvaluationCallback
from areal_tasks.trainer.callbacks.summary import SummaryCallback
from areal_tasks.trainer.tracking import callbacks_from_config
from tests.unit.trainer.rl_fakes import Log, Recorder, fake_run


def test_evaluation_before_every_freq_steps_into_the_metrics_and_after(tmp_path: Path) -> None:
    log: Log = []
    run = fake_run(tmp_path, log, "evaluation.freq_steps=2", "dataset.eval_path=demo:arithmetic", n_steps=4)
    evaluation = EvaluationCallback(run)
    run.callbacks = CallbackList([evaluation, Recorder(log)])
    run.callbacks.on_start(4)
    assert log[:2] == [("evaluate", "sampled"), ("evaluate", "greedy")]
    assert evaluation.before["eval/reward"] == pytest.approx(0.1)
    for step in (1, 2, 3, 4):
        metrics = {"reward/mean": 0.5}
        log.clear()
        run.callbacks.on_step_metrics(step, metrics)
        if step == 2:  # every 2 steps, but not at the last one (the final evaluation covers it)
            assert metrics["eval/reward"] == pytest.approx(0.3) and "eval_greedy/reward" not in metrics
            assert ("logger.on_eval", 2, {k: v for k, v in metrics.items() if k.startswith("eval/")}, None) in log
        else:
            assert metrics == {"reward/mean": 0.5} and not [e for e in log if e[0] == "evaluate"]
    summary: dict = {}
    log.clear()
    run.callbacks.on_train_end(summary)
    assert [e for e in log if e[0] == "evaluate"] == [("evaluate", "sampled"), ("evaluate", "greedy")]
    assert [e[:2] for e in log if e[0] == "logger.on_eval"] == [("logger.on_eval", 4)]
    assert list(summary) == [
        "reward_before",
        "reward_after",
        "accuracy_before",
        "accuracy_after",
        "greedy_accuracy_before",
        "greedy_accuracy_after",
        "eval_temperature",
        "eval_samples_per_prompt",
        "eval_prompts",
    ]
    assert summary["reward_before"] == pytest.approx(0.1) and summary["reward_after"] == pytest.approx(0.4)
    assert summary["greedy_accuracy_after"] == pytest.approx(0.5) and summary["eval_prompts"] == 8


def test_evaluation_needs_the_rollout_side(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rollout side"):
        EvaluationCallback(fake_run(tmp_path, [], main=False))


def test_checkpoints_every_freq_steps_and_the_last_announced_once_complete(tmp_path: Path) -> None:
    log: Log = []
    run = fake_run(tmp_path, log, n_steps=5, freq=2)
    run.callbacks = CallbackList([CheckpointCallback(run), Recorder(log)])
    for step in range(1, 6):
        run.version = step
        run.side.executor.version = step
        run.callbacks.on_step_end(step, {"reward/mean": 0.5, "eval/reward": 0.25, "actor/loss": 1.0})
    assert [e for e in log if e[0] in ("save", "logger.on_checkpoint")] == [
        ("save", 2),
        ("logger.on_checkpoint", 2, "file:///ckpt/step_2", {"step": 2}),
        ("save", 4),
        ("logger.on_checkpoint", 4, "file:///ckpt/step_4", {"step": 4}),
        ("save", 5),
        ("logger.on_checkpoint", 5, "file:///ckpt/step_5", {"step": 5}),
    ]
    step, state, metrics = run.manager.saved[0]
    assert (step, state.step, state.version, state.executor) == (2, 2, 2, {"format": 1, "version": 2})
    assert metrics == {"reward/mean": 0.5, "eval/reward": 0.25}  # what retention may rank by
    run.callbacks.on_end({})
    assert log[-2][0] == "manager.close"


def test_a_save_still_writing_is_not_announced(tmp_path: Path) -> None:
    log: Log = []
    run = fake_run(tmp_path, log, n_steps=2, complete=False)
    run.callbacks = CallbackList([CheckpointCallback(run), Recorder(log)])
    run.callbacks.on_step_end(2, {})
    assert ("save", 2) in log and not [e for e in log if e[0] == "logger.on_checkpoint"]


def test_other_ranks_save_without_an_executor_state(tmp_path: Path) -> None:
    log: Log = []
    run = fake_run(tmp_path, log, n_steps=2, main=False)
    CheckpointCallback(run).on_step_end(2, {})
    assert run.manager.saved[0][1].executor == {}


def test_the_summary_holds_the_runs_facts_and_is_written(tmp_path: Path) -> None:
    log: Log = []
    run = fake_run(tmp_path, log, n_steps=3)
    summary_cb = SummaryCallback(run)
    for step in (1, 2, 3):
        summary_cb.on_step(step, {"reward/mean": 0.1 * step})
    run.version = 3
    summary = {"reward_before": 0.1}
    summary_cb.on_train_end(summary)
    assert list(summary) == [
        "reward_before",
        "steps",
        "first_step",
        "final_version",
        "wall_seconds",
        "last_step",
        "executor",
        "engine_layout",
    ]
    assert (summary["steps"], summary["first_step"], summary["final_version"]) == (3, 1, 3)
    assert summary["engine_layout"] == {"actor": {"world_size": 2, "dp": 2, "tp": 1, "sp": 1}}
    assert summary["last_step"] == {"reward/mean": pytest.approx(0.3)} and summary["executor"] == {"accepted": 16}
    assert summary["wall_seconds"] > 0
    summary_cb.on_end(summary)
    written = json.loads((tmp_path / "rl_summary.json").read_text())
    assert written["steps"] == 3 and written["last_step"]["reward/mean"] == pytest.approx(0.3)


def test_the_job_list_puts_the_run_around_the_loggers(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [])
    kinds = [type(cb) for cb in callbacks_from_config(run.cfg, tmp_path, run=run)]
    assert kinds == [EvaluationCallback, SummaryCallback, ConsoleProgress, JsonlMetrics, CheckpointCallback]
    given = Recorder([])
    chosen = callbacks_from_config(run.cfg, tmp_path, run=run, loggers=[given])
    assert chosen[2] is given and [type(cb) for cb in chosen[:2] + chosen[3:]] == [
        EvaluationCallback,
        SummaryCallback,
        CheckpointCallback,
    ]
    other = fake_run(tmp_path, [], main=False)
    assert [type(cb) for cb in callbacks_from_config(other.cfg, tmp_path, run=other)] == [CheckpointCallback]
