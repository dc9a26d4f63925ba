"""``benchmarks/async_vs_sync.py`` trains the warm-started model, whatever ``model.path`` the
caller's overrides name (they name the model the warm start starts from: the GPU runs pass the
0.5B shape there, and before this rule their RL runs trained that random model instead); its
summary of a run takes the steady-state medians after the first update."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from benchmarks.async_vs_sync import CONFIG, rl_overrides


def test_the_warm_start_is_the_policy_and_the_callers_other_settings_stay(tmp_path: Path) -> None:
    extra = [
        "model.path=tiny:qwen2?hidden_size=96",
        "actor.optimizer.lr=2e-5",
        "rollout.max_head_offpolicyness=7",
        "rollout.pause_mode=in_place",
    ]
    cfg = load_config(CONFIG, rl_overrides(tmp_path / "eta2", str(tmp_path / "sft"), 2, 5, extra))
    assert cfg.model.path == str(tmp_path / "sft")
    assert cfg.rollout.max_head_offpolicyness == 2 and cfg.train.total_steps == 5
    assert cfg.train.sft_warmup_steps == 0 and cfg.experiment.run_dir == str(tmp_path / "eta2")
    assert cfg.actor.optimizer.lr == 2e-5 and cfg.rollout.pause_mode == "in_place"
    assert cfg.rollout.workflow.name == "benchmarks.long_tail_workflow:LongTailWorkflow"


def test_the_summary_takes_medians_after_the_first_update_and_the_table_shows_them() -> None:
    from benchmarks.async_vs_sync import format_table, summarize

    def step(update: float, paused: float) -> dict[str, float]:
        return {
            "perf/step_s": 1.0,
            "perf/rollout_wait_s": 0.25,
            "perf/train_s": 0.5,
            "perf/weight_update_s": update,
            "perf/servers_paused_s": paused,
            "perf/weight_queue_s": 0.001,
            "perf/weight_pause_s": 0.002,
            "perf/weight_transfer_s": paused - 0.003,
            "perf/weight_resume_s": 0.0,
        }

    rows = [step(0.5, 0.4), step(0.02, 0.01), step(0.03, 0.012), step(0.9, 0.8)]
    summary = {
        "reward_before": 0.25,
        "reward_after": 0.5,
        "greedy_accuracy_after": 0.5,
        "wall_seconds": 9.0,
        "executor": {"staleness_hist": {"0": 3, "2": 1}},
    }
    result = summarize(2, rows, summary, batch_size=8)
    assert result["samples"] == 32 and result["samples_per_s"] == 8.0
    assert result["update_p50_ms"] == 30.0 and result["paused_p50_ms"] == 12.0  # the first update left out
    assert (
        result["update_ms"] == pytest.approx(362.5) and result["staleness_mean"] == 0.5 and result["staleness_max"] == 2
    )
    table = format_table([result])
    assert "update_p50" in table.splitlines()[0] and "  30 " in table.splitlines()[1]
