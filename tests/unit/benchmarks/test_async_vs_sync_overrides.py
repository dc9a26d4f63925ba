"""``benchmarks/async_vs_sync.py`` trains the warm-started model, whatever ``model.path`` the
caller's overrides name (they name the model the warm start starts from: the GPU runs pass the
0.5B shape there, and before this rule their RL runs trained that random model instead). The
summary of a run is tested in ``test_async_vs_sync_summary.py``."""

from __future__ import annotations

from pathlib import Path

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
