"""The rollout side wired from the config (no server needed: nothing here generates): the executor
gets the algorithm's group filter (DAPO's dynamic sampling; none for GRPO), the training, evaluation
and greedy workflows are the configured workflow with its options and system prompt; prompts over
``dataset.max_prompt_len`` are dropped when the training data is read."""

from __future__ import annotations

import json
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
            "dataset.max_prompt_len=200",  # FakeTokenizer: one token per character
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
                200,
            )  # dataset.max_prompt_len
        temperatures = [
            w.sampling.temperature for w in (side.executor._groups.workflow, side.eval_workflow, side.greedy_workflow)
        ]
        assert temperatures == [1.0, 0.5, 0.0]
    finally:
        side.close()


def test_prompts_longer_than_max_prompt_len_are_dropped_when_the_data_is_read(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * n, "answer": "1"}) + "\n" for n in (5, 40, 10, 80, 20)))
    side = build(tmp_path, f"dataset.path={data}", "rollout.workflow.system_prompt=S")
    try:
        workflow = side.executor._groups.workflow
        lengths = {len(r.prompt): len(workflow.render_item(r)) for r in side.executor._data.dataset}
    finally:
        side.close()
    assert sorted(lengths) == [5, 10, 20, 40, 80]
    side = build(
        tmp_path, f"dataset.path={data}", "rollout.workflow.system_prompt=S", f"dataset.max_prompt_len={lengths[20]}"
    )
    try:
        assert [len(r.prompt) for r in side.executor._data.dataset] == [5, 10, 20]
    finally:
        side.close()
