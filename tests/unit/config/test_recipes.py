"""The shipped recipes validate; base.yaml spells out exactly the schema defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config


def test_base_yaml_equals_schema_defaults(repo_root: Path) -> None:
    assert load_config(repo_root / "configs" / "base.yaml") == load_config()


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))
)
def test_every_recipe_validates(repo_root: Path, name: str) -> None:
    load_config(repo_root / "configs" / name)


def test_demo_grpo_is_small_grpo_on_tiny_qwen2(repo_root: Path) -> None:
    cfg = load_config(repo_root / "configs" / "demo_grpo.yaml")
    assert (cfg.model.path.split("?", 1)[0], cfg.algorithm.name) == ("tiny:qwen2", "grpo")
    # the demo task, possibly with options (``demo:arithmetic?digits=1&...``)
    assert cfg.dataset.path.split("?", 1)[0] == "demo:arithmetic"
    assert cfg.train.batch_size <= 64 and cfg.rollout.sampling.max_new_tokens <= 32


@pytest.mark.parametrize(("task", "reward"), [("gsm8k", "gsm8k"), ("code", "code_tests")])
def test_task_recipes_and_their_cpu_variants(repo_root: Path, task: str, reward: str) -> None:
    gpu = load_config(repo_root / "configs" / f"{task}_grpo.yaml")
    cpu = load_config(repo_root / "configs" / f"{task}_grpo_cpu.yaml")
    assert gpu.cluster.gpus_per_node > 0 and gpu.rollout.backend == "sglang" and gpu.algorithm.name == "grpo"
    assert not gpu.model.path.startswith("tiny:") and gpu.model.dtype == "bfloat16"
    # the CPU variant is the same task, prompt and reward on the embedded defaults
    assert cpu.cluster.gpus_per_node == 0 and cpu.rollout.backend == "embedded"
    assert cpu.model.path.startswith("tiny:") and cpu.train.total_steps <= 3
    for cfg in (gpu, cpu):
        assert cfg.rollout.reward.fn == reward and cfg.algorithm.name == "grpo"
        assert cfg.dataset.eval_path is not None
    assert cpu.rollout.workflow.system_prompt == gpu.rollout.workflow.system_prompt
    marker = "####" if task == "gsm8k" else "```python"
    assert marker in gpu.rollout.workflow.system_prompt
    # the CPU variant's data is committed (examples/recipes/), so it runs from a fresh clone
    assert (repo_root / cpu.dataset.path).is_file() and (repo_root / cpu.dataset.eval_path).is_file()
