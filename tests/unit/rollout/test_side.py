"""The rollout side wired from the config (no server needed: nothing here generates): the executor
gets the algorithm's group filter (DAPO's dynamic sampling; none for GRPO), the training, evaluation
and greedy workflows are the configured workflow with its options and system prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.algo.filters import informative_group
from areal_tasks.config import load_config
from areal_tasks.rollout.side import RolloutSide
from areal_tasks.rollout.workflows import MultiTurnWorkflow
from tests.unit.rollout.workflow_fakes import FakeTokenizer


def build(tmp_path: Path, *overrides: str) -> RolloutSide:
    cfg = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={tmp_path}",
            "dataset.path=demo:arithmetic?n_train=16&n_eval=4",
            "rollout.reward.workers=0",
            *overrides,
        ],
    )
    return RolloutSide.build(cfg, ["127.0.0.1:1"], FakeTokenizer(), version=3)


@pytest.mark.parametrize(("algorithm", "expected"), [("dapo", informative_group), ("grpo", None)])
def test_the_group_filter_comes_from_the_algorithm(tmp_path: Path, algorithm: str, expected: object) -> None:
    side = build(tmp_path, f"algorithm.name={algorithm}")
    try:
        assert side.executor._groups.group_filter is expected
        assert side.executor.state_dict()["version"] == 3
    finally:
        side.close()


def test_the_workflows_are_the_configured_one(tmp_path: Path) -> None:
    side = build(
        tmp_path,
        "rollout.workflow.name=multi_turn",
        "rollout.workflow.options.max_turns=3",
        "rollout.workflow.system_prompt=Be brief.",
        "evaluation.temperature=0.5",
    )
    try:
        for workflow in (side.executor._groups.workflow, side.eval_workflow, side.greedy_workflow):
            assert isinstance(workflow, MultiTurnWorkflow)
            assert (workflow.max_turns, workflow.system_prompt, workflow.max_prompt_len) == (
                3,
                "Be brief.",
                64,
            )  # dataset.max_prompt_len
        temperatures = [
            w.sampling.temperature for w in (side.executor._groups.workflow, side.eval_workflow, side.greedy_workflow)
        ]
        assert temperatures == [1.0, 0.5, 0.0]
    finally:
        side.close()
