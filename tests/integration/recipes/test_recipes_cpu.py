"""The CPU variants of the GSM8K and code recipes (configs/*_grpo_cpu.yaml) run end to end with
``areal train``: a tiny random model, one embedded server, one train worker, 3 GRPO steps on the
fixture data (tests/fixtures/recipe_data.py, written to the test's directory).

What a user of the recipe sees is checked, not learning: the run completes, one metrics row per
step, rewards in [0, 1], every episode scored without a reward error (a failing reward fails its
episode and counts in the executor's ``failed``). For the code recipe the fixture's reference
solutions also score 1.0 through the job's own reward path (``RewardRunner("code_tests")`` in a
worker process, so the sandbox runs), and a wrong one 0.0: a run whose rewards are all 0.0 (a random
model writes no working code) is then a statement about the model, not a sandbox that never ran.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from areal_tasks.cli import main
from areal_tasks.config import load_config
from areal_tasks.rollout.rewards import RewardRunner
from tests.fixtures.recipe_data import code_items, write_recipe_data

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def run_recipe(tmp_path: Path, task: str) -> tuple[dict, list[dict]]:
    data = write_recipe_data(tmp_path / "data")
    run_dir = tmp_path / "run"
    overrides = [
        f"experiment.run_dir={run_dir}",
        f"dataset.path={data[f'{task}_train.jsonl']}",
        f"dataset.eval_path={data[f'{task}_eval.jsonl']}",
    ]
    config = f"configs/{task}_grpo_cpu.yaml"
    assert main(["train", "--config", config, *overrides]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]
    steps = load_config(config).train.total_steps
    assert summary["steps"] == steps and [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:
        assert 0.0 <= row["reward/mean"] <= row["reward/max"] <= 1.0
        assert row["rollout/n_samples"] == load_config(config).train.batch_size
        assert math.isfinite(row["actor/grad_norm"])
    executor = summary["executor"]
    assert executor["failed"] == 0 and executor["consumed_samples"] == steps * load_config(config).train.batch_size
    for key in ("reward_before", "reward_after", "accuracy_before", "accuracy_after"):
        assert 0.0 <= summary[key] <= 1.0
    return summary, rows


def test_gsm8k_recipe_on_cpu(tmp_path: Path) -> None:
    summary, _ = run_recipe(tmp_path, "gsm8k")
    assert summary["eval_prompts"] == 4


def test_code_recipe_on_cpu_runs_the_sandbox(tmp_path: Path) -> None:
    summary, _ = run_recipe(tmp_path, "code")
    assert summary["eval_prompts"] == 4
    items = code_items(4, seed=2)  # the eval split's problems

    async def score(runner: RewardRunner) -> list[float]:
        right = [runner.score(f"```python\n{item['solution']}```", item["answer"]) for item in items]
        wrong = runner.score("```python\ndef add(a, b):\n    return a - b\n```", items[0]["answer"])
        return await asyncio.gather(*right, wrong)

    cfg = load_config("configs/code_grpo_cpu.yaml")
    with RewardRunner(cfg.rollout.reward.fn, max_workers=1, timeout_s=cfg.rollout.reward.timeout_s) as runner:
        assert asyncio.run(score(runner)) == [1.0, 1.0, 1.0, 1.0, 0.0]
