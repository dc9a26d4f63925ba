"""``run_rl_rank`` on fakes (engines, rollout side, checkpoint manager, publisher, step runner): the
order of the loop's side effects, which the callbacks now carry.

Checked: recovery (executor state, recovered weights pushed) before ``on_start`` and the first step;
the starting evaluation before the executor starts; per step the batch, the training, the weight
update, then the evaluation's metrics merged before any logger sees them, logging before the
checkpoint save, ``on_checkpoint`` after a complete save; at the end the executor stopped before the
final evaluation, ``rl_summary.json`` written before the loggers' ``on_end``, the checkpoint manager
closed after it; a failure reported to the callbacks and re-raised; the publisher closed before the
rollout side and the engines, on success and on failure; other ranks only checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import areal_tasks.trainer.engines as engines_module
import areal_tasks.trainer.rl_batch as rl_batch_module
import areal_tasks.trainer.rl_step as rl_step_module
import areal_tasks.trainer.weight_publisher as publisher_module
from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.rollout.side import RolloutSide
from areal_tasks.trainer.rl_loop import run_rl_rank
from tests.unit.trainer.rl_fakes import FakeEngine, FakeManager, FakeSide, Log, Recorder, job

EVAL = ("dataset.eval_path=demo:arithmetic", "evaluation.freq_steps=2")


class FakePublisher:
    def __init__(self, log: Log) -> None:
        self.log = log

    def publish(self, version: int) -> dict[str, float]:
        self.log.append(("publish", version))
        return {"perf/weight_update_s": 0.01}

    def close(self) -> None:
        self.log.append(("publisher.close",))


class FakeStep:
    def __init__(self, log: Log, fail_at: int | None) -> None:
        self.log, self.fail_at, self.calls = log, fail_at, 0

    def run(self, batch: Any, step: int | None = None) -> dict[str, float]:
        self.calls += 1
        assert isinstance(step, int)  # the loop names the step (fault points use it)
        self.log.append(("train",))
        if self.calls == self.fail_at:
            raise RuntimeError("the step blew up")
        return {"reward/mean": 0.5, "n_tokens": 40.0}


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``run(*overrides, total_steps=, recovered=, fail_at=, rank=)`` -> (summary, log, manager);
    ``run.log`` is the last run's log (also when it raised), ``run.side`` its rollout side."""

    def run(
        *overrides: str,
        total_steps: int = 4,
        recovered: TrainerState | None = None,
        fail_at: int | None = None,
        rank: int = 0,
    ) -> tuple[dict[str, Any], Log, FakeManager]:
        log: Log = []
        run.log = log  # type: ignore[attr-defined]
        manager = FakeManager(log, recovered=recovered)
        side = FakeSide(log)
        run.side = side  # type: ignore[attr-defined]
        monkeypatch.setattr(engines_module, "build_engines", lambda cfg, model_dir, n: {"actor": FakeEngine(log, rank)})
        monkeypatch.setattr(CheckpointManager, "from_config", classmethod(lambda cls, cfg: manager))
        monkeypatch.setattr(RolloutSide, "open", classmethod(lambda cls, cfg, addresses, model_dir, version: side))
        monkeypatch.setattr(publisher_module, "WeightPublisher", lambda cfg, actor, side, run_dir: FakePublisher(log))
        monkeypatch.setattr(rl_step_module, "RLStep", lambda *a, **kw: FakeStep(log, fail_at))
        monkeypatch.setattr(rl_batch_module, "pack_trajectories", lambda payload, group_size, version: payload)
        cfg = job(tmp_path, f"train.total_steps={total_steps}", "train.sft_warmup_steps=0", *overrides)
        summary = run_rl_rank(cfg, "/model", ["127.0.0.1:1"], callbacks=[Recorder(log)])
        return summary, log, manager

    return run


def names(log: Log) -> list[str]:
    return [e[0] for e in log]


def test_a_run_in_the_order_of_its_side_effects(loop: Any, tmp_path: Path) -> None:
    summary, log, _ = loop(*EVAL)
    step_2 = [e for e in log if len(e) > 1 and e[1] == 2 and e[0].startswith("logger.on_step")]
    assert [e[0] for e in step_2] == ["logger.on_step_metrics", "logger.on_step", "logger.on_step_end"]
    assert "eval/reward" in step_2[1][2]  # merged into the step's metrics before the loggers' on_step
    start = names(log).index("logger.on_start")
    assert names(log)[:start] == ["evaluate", "evaluate"]  # the starting policy, sampled and greedy
    assert names(log)[start + 1] == "executor.start"
    body = names(log)[start + 2 :]
    one_step = ["executor.prepare_batch", "train", "publish", "logger.on_step_metrics", "logger.on_step"]
    assert body[:6] == [*one_step, "logger.on_step_end"]
    second = body[6:]
    assert second[:3] == ["executor.prepare_batch", "train", "publish"]
    assert second[3:9] == [
        "evaluate",  # evaluation.freq_steps=2
        "logger.on_eval",
        "logger.on_step_metrics",
        "logger.on_step",
        "logger.on_step_end",
        "save",  # after the step is logged
    ]
    assert second[9] == "logger.on_checkpoint"
    tail = names(log)[names(log).index("executor.stop") :]
    assert tail == [
        "executor.stop",
        "evaluate",
        "evaluate",
        "logger.on_eval",
        "logger.on_train_end",
        "logger.on_end",
        "manager.close",
        "publisher.close",
        "side.close",
        "engine.destroy",
    ]
    assert [e[1] for e in log if e[0] == "publish"] == [1, 2, 3, 4]
    assert [e[1] for e in log if e[0] == "save"] == [2, 4]
    assert summary["steps"] == 4 and summary["first_step"] == 1 and summary["final_version"] == 4
    assert summary["engine_layout"] == {"actor": {"world_size": 2, "dp": 2, "tp": 1, "sp": 1}}
    assert summary["last_step"]["rollout/reward_mean"] == 0.5 and summary["last_step"]["version"] == 4.0
    assert json.loads((tmp_path / "rl_summary.json").read_text())["final_version"] == 4
    assert next(e for e in log if e[0] == "logger.on_end")[1] == summary


def test_the_step_metrics_keep_their_keys(loop: Any) -> None:
    summary, _, _ = loop()
    assert list(summary["last_step"]) == [
        "reward/mean",
        "n_tokens",
        "perf/train_s",
        "perf/weight_update_s",
        "perf/rollout_wait_s",
        "perf/step_s",
        "perf/tokens_per_s",
        "version",
        "rollout/reward_mean",
        "rollout/wait_s",
    ]
    assert list(summary)[:9] == [
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
    assert list(summary)[9:] == [
        "steps",
        "first_step",
        "final_version",
        "wall_seconds",
        "last_step",
        "executor",
        "engine_layout",
    ]


def test_recovery_comes_before_the_first_step(loop: Any) -> None:
    state = TrainerState(step=2, version=2, executor={"format": 1, "version": 2})
    summary, log, manager = loop(total_steps=4, recovered=state)
    order = names(log)
    assert order.index("executor.load_state_dict") < order.index("publish") < order.index("logger.on_start")
    assert next(e for e in log if e[0] == "publish") == ("publish", 2)  # the recovered weights, before any step
    assert [e for e in log if e[0] == "logger.on_start"] == [("logger.on_start", 2)]
    assert (summary["first_step"], summary["final_version"]) == (3, 4)
    assert [step for step, _, _ in manager.saved] == [4]


def test_a_failure_is_reported_then_raised_and_everything_closes(loop: Any, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the step blew up"):
        loop(total_steps=4, fail_at=2)
    log = loop.log
    assert ("logger.fail", "RuntimeError: the step blew up") in log
    assert "logger.on_end" not in names(log) and not (tmp_path / "rl_summary.json").exists()
    assert names(log)[-3:] == ["publisher.close", "side.close", "engine.destroy"]


def test_other_ranks_only_checkpoint(loop: Any, tmp_path: Path) -> None:
    summary, log, manager = loop(total_steps=2, rank=1)
    assert summary == {}
    assert not [e for e in log if e[0].startswith(("logger.", "evaluate", "executor."))]
    assert [step for step, _, _ in manager.saved] == [2] and manager.saved[0][1].executor == {}
    assert names(log)[-3:] == ["manager.close", "publisher.close", "engine.destroy"]


def test_each_trained_step_is_marked_for_the_session_trace(loop: Any) -> None:
    loop(total_steps=3)
    assert loop.side.executor.trained_steps == [1, 2, 3]
    with pytest.raises(RuntimeError, match="blew up"):
        loop(total_steps=3, fail_at=2)
    assert loop.side.executor.trained_steps == [1]  # the failed step's batch was not trained
