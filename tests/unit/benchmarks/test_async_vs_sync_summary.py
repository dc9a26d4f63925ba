"""``benchmarks/async_vs_sync.py``'s summary of a run: the throughput over the steps after the
warm-up (whose seconds are reported apart), the synchronous run's per-step generation and training
times and the overlap efficiency, and the weight update's median, p90 and max over steps 2 onward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.errors import ConfigError
from benchmarks.async_vs_sync import (
    compare,
    format_table,
    overlap_efficiency,
    split_warmup,
    spread,
    summarize,
    summarize_kept,
)


def step(step_s: float, wait: float, train: float, update: float = 0.02, paused: float = 0.01) -> dict[str, float]:
    return {
        "perf/step_s": step_s,
        "perf/rollout_wait_s": wait,
        "perf/train_s": train,
        "perf/weight_update_s": update,
        "perf/servers_paused_s": paused,
        "perf/weight_queue_s": 0.001,
        "perf/weight_pause_s": 0.002,
        "perf/weight_transfer_s": paused - 0.003,
        "perf/weight_resume_s": 0.0005,
        "perf/weight_pack_s": 0.004,
    }


SUMMARY: dict[str, Any] = {
    "reward_before": 0.25,
    "reward_after": 0.5,
    "greedy_accuracy_after": 0.5,
    "wall_seconds": 99.0,
    "executor": {"staleness_hist": {"0": 3, "2": 1}},
}


def test_the_warm_up_steps_are_left_out_of_the_throughput_and_reported_apart() -> None:
    # two compile-heavy steps (40 s, 38 s), then four steady ones of 1 s (0.75 s waiting, 0.25 s training)
    rows = [step(40.0, 1.0, 39.0), step(38.0, 0.5, 37.5)] + [step(1.0, 0.75, 0.25) for _ in range(4)]
    result = summarize(0, rows, SUMMARY, batch_size=8, warmup_steps=2)
    assert result["warmup_steps"] == 2 and result["steady_steps"] == 4 and result["steps"] == 6
    assert result["warmup_s"] == 78.0 and result["warmup_train_s"] == 76.5
    assert result["samples"] == 32 and result["samples_per_s"] == 8.0  # 4 steps x 8 samples in 4 s
    assert result["samples_per_s_all"] == pytest.approx(48 / 82)  # what the old window reported
    assert result["gen_s"] == 0.75 and result["train_s"] == 0.25
    assert result["staleness_mean"] == 0.5 and result["staleness_max"] == 2


def test_the_late_window_also_leaves_out_eta_steps_of_head_start() -> None:
    rows = [step(10.0, 0.0, 9.0), step(0.5, 0.0, 0.4), step(0.5, 0.0, 0.4)] + [step(2.0, 1.5, 0.4)] * 2
    result = summarize(2, rows, SUMMARY, batch_size=4, warmup_steps=1)
    assert result["samples_per_s"] == pytest.approx(16 / 5.0)
    assert result["samples_per_s_late"] == pytest.approx(8 / 4.0)  # steps 4 and 5 only
    short = summarize(2, rows[:3], SUMMARY, batch_size=4, warmup_steps=1)
    assert short["samples_per_s_late"] is None  # nothing left after the head start


def test_the_weight_update_spread_covers_steps_two_onward_with_the_tail() -> None:
    updates = [0.5, 0.02, 0.03, 0.9] + [0.01] * 7  # the first (0.5 s) sets up the buffer
    rows = [step(1.0, 0.5, 0.4, update=u, paused=u / 2) for u in updates]
    result = summarize(2, rows, SUMMARY, batch_size=8, warmup_steps=2)
    assert result["first_update_ms"] == 500.0
    # steps 2-11: 0.01 x 7, 0.02, 0.03, 0.9 -> median 0.01, p90 (9th of 10) 0.03, max 0.9
    assert result["update_p50_ms"] == pytest.approx(10.0)
    assert result["update_p90_ms"] == pytest.approx(30.0)
    assert result["update_max_ms"] == pytest.approx(900.0)
    assert result["paused_max_ms"] == pytest.approx(450.0) and result["transfer_max_ms"] == pytest.approx(447.0)
    assert result["resume_p50_ms"] == pytest.approx(0.5) and result["pack_p90_ms"] == pytest.approx(4.0)


def test_spread_is_median_nearest_rank_p90_and_max() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"p50": 2.0, "p90": 3.0, "max": 3.0}
    assert spread(list(map(float, range(1, 21)))) == {"p50": 10.5, "p90": 18.0, "max": 20.0}
    with pytest.raises(ConfigError, match="at least one value"):
        spread([])


def test_overlap_efficiency_is_the_speed_up_over_the_ideal_overlap() -> None:
    # G = 3, T = 1: hiding training entirely behind generation gives (3 + 1) / 3 = 1.33x
    assert overlap_efficiency(4 / 3, 3.0, 1.0) == pytest.approx(1.0)
    assert overlap_efficiency(1.0, 3.0, 1.0) == pytest.approx(0.75)  # no gain: 1 / ideal
    assert overlap_efficiency(1.5, 1.0, 1.0) == pytest.approx(0.75)  # ideal 2x
    with pytest.raises(ConfigError, match="positive"):
        overlap_efficiency(1.0, 0.0, 0.0)


def test_compare_uses_the_synchronous_runs_g_and_t_and_the_table_shows_them() -> None:
    sync_rows = [step(30.0, 1.0, 29.0)] * 2 + [step(1.0, 0.75, 0.25)] * 4
    async_rows = [step(30.0, 0.0, 29.0)] * 2 + [step(0.8, 0.55, 0.25)] * 4
    results = [
        summarize(0, sync_rows, SUMMARY, batch_size=8),
        summarize(2, async_rows, SUMMARY, batch_size=8),
    ]
    sync = compare(results)
    assert sync == {"gen_s": 0.75, "train_s": 0.25, "ideal_speed_up": pytest.approx(1 / 0.75)}
    assert results[0]["speed_up"] == 1.0 and results[1]["speed_up"] == pytest.approx(1.25)
    assert results[1]["overlap_efficiency"] == pytest.approx(1.25 * 0.75)
    lines = format_table(results).splitlines()
    assert "warmup_s" in lines[0] and "overlap" in lines[0]
    assert "1.25x" in lines[2] and "0.94" in lines[2] and "60.0" in lines[2]  # speed-up, overlap, warm-up s
    assert any("G=0.750 s, T=0.250 s" in line and "1.33x" in line for line in lines)
    assert any("update p50/p90/max ms" in line for line in lines)


def test_without_a_synchronous_run_there_is_no_speed_up() -> None:
    rows = [step(30.0, 0.0, 29.0)] * 2 + [step(0.8, 0.55, 0.25)] * 4
    results = [summarize(2, rows, SUMMARY, batch_size=8)]
    assert compare(results) is None and results[0]["speed_up"] is None
    cells = format_table(results).splitlines()[1].split()
    assert cells[4] == "-" and cells[8] == "-"  # speed-up and overlap


def test_too_few_steps_for_the_warm_up_is_a_clear_error() -> None:
    rows = [step(1.0, 0.5, 0.5)] * 2
    with pytest.raises(ConfigError, match="raise --steps"):
        split_warmup(rows, 2)
    with pytest.raises(ConfigError, match="0 or more"):
        split_warmup(rows, -1)
    warm, steady = split_warmup(rows, 0)
    assert warm == [] and len(steady) == 2


def test_kept_per_step_metrics_are_summarized_again_without_a_run(tmp_path: Path) -> None:
    rows = [step(20.0, 1.0, 19.0)] + [step(1.0, 0.6, 0.3)] * 3
    for row in rows:
        row.update({"rollout/n_samples": 64.0, "staleness/mean": 1.0, "staleness/max": 2.0})
    path = tmp_path / "rl_metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    [result] = summarize_kept([f"2={path}"], warmup_steps=1)
    assert result["eta"] == 2 and result["samples_per_s"] == pytest.approx(64.0) and result["warmup_s"] == 20.0
    assert result["reward_before"] is None and result["staleness_mean"] == 1.0 and result["staleness_max"] == 2
    cells = format_table([result]).splitlines()[1].split()
    assert cells[9] == "-" and cells[10] == "1.00/2"  # no reward; the steps' own staleness
    with pytest.raises(ConfigError, match="ETA=PATH"):
        summarize_kept([str(path)], warmup_steps=1)
    path.write_text(json.dumps(step(1.0, 0.5, 0.5)) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="rollout/n_samples"):
        summarize_kept([f"0={path}"], warmup_steps=0)


def test_the_script_rescores_kept_metrics_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "eta0.jsonl"
    rows = [{**step(9.0, 1.0, 8.0), "rollout/n_samples": 8.0}] + [{**step(1.0, 0.5, 0.4), "rollout/n_samples": 8.0}] * 2
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "rescored.json"
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "async_vs_sync.py"
    env = {**os.environ, "PYTHONPATH": str(script.parents[1])}
    cmd = [sys.executable, str(script), "--warmup-steps", "1", "--metrics", f"0={path}", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["results"][0]["samples_per_s"] == pytest.approx(8.0) and payload["synchronous"]["gen_s"] == 0.5
    assert "1+2" in done.stdout
