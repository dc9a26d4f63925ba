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
