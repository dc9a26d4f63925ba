"""The workflow registry: names, each workflow's options checked before a job starts (from the
config, through ``areal config validate``'s checks), and the job's workflow built from its config
section (its options, the system prompt and ``max_prompt_len``). docs/workflows.md documents every
registered workflow and its options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.api.inference import SamplingParams
from areal_tasks.config import load_config
from areal_tasks.config.rollout import WorkflowConfig
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.workflows import (
    WORKFLOWS,
    MultiTurnWorkflow,
    RLVRWorkflow,
    build_workflow,
    check_workflow,
    workflow_problems,
)
from tests.unit.rollout.workflow_fakes import FakeTokenizer, arith_reward

ROOT = Path(__file__).resolve().parents[3]
SAMPLING = SamplingParams(max_new_tokens=8)


def plain_factory(tokenizer: Any, sampling: Any, reward: Any, *, depth: int = 1, max_prompt_len: int | None = None):
    """A workflow factory without ``options_class``: its keyword parameters are its options."""
    return RLVRWorkflow(tokenizer, sampling, reward, max_prompt_len=max_prompt_len)


def test_names_and_unknown_names() -> None:
    assert {"rlvr", "multi_turn"} <= set(WORKFLOWS.names())
    (problem,) = workflow_problems(WorkflowConfig(name="multi_trun"))
    assert problem.startswith("rollout.workflow.name: unknown workflow 'multi_trun'; did you mean 'multi_turn'?")
    assert "import path package.module:factory" in problem


def test_multi_turn_options_are_checked_by_name_type_and_value() -> None:
    assert workflow_problems(WorkflowConfig(name="multi_turn", options={"max_turns": 3, "turn_discount": 1})) == []
    (typo,) = workflow_problems(WorkflowConfig(name="multi_turn", options={"max_turn": 3}))
    assert "rollout.workflow.options.max_turn: unknown key; did you mean rollout.workflow.options.max_turns?" in typo
    (wrong_type,) = workflow_problems(WorkflowConfig(name="multi_turn", options={"max_turns": "two"}))
    assert wrong_type.startswith("rollout.workflow.options.max_turns: expected int")
    (bad,) = workflow_problems(WorkflowConfig(name="multi_turn", options={"max_turns": 0, "turn_discount": 0}))
    assert bad.startswith("rollout.workflow.options: ") and "max_turns=0" in bad and "turn_discount=0" in bad


def test_rlvr_takes_no_options_and_the_job_options_are_not_options() -> None:
    (problem,) = workflow_problems(WorkflowConfig(name="rlvr", options={"max_turns": 2}))
    assert problem == "rollout.workflow.options: workflow 'rlvr' takes no options, got 'max_turns'"
    (problem,) = workflow_problems(WorkflowConfig(name="multi_turn", options={"system_prompt": "x"}))
    assert "rollout.workflow.options.system_prompt: set by the job" in problem


def test_import_path_workflows_are_checked_when_loaded() -> None:
    path = f"{__name__}:plain_factory"
    lazy = WorkflowConfig(name=path, options={"depth": 2, "width": 3})
    assert workflow_problems(lazy) == []  # validation does not import user code
    (problem,) = workflow_problems(lazy, load=True)
    assert (
        problem
        == f"rollout.workflow.options: workflow {path!r} takes no option 'width'; it takes: depth, max_prompt_len"
    )
    with pytest.raises(ConfigError, match="width"):
        check_workflow(lazy)
    check_workflow(WorkflowConfig(name=path, options={"depth": 2}))
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        check_workflow(WorkflowConfig(name="no_such_module:factory"))


def test_config_validation_refuses_bad_workflows(tmp_path: Path) -> None:
    base = [f"experiment.run_dir={tmp_path}", "rollout.workflow.name=multi_turn"]
    cfg = load_config(overrides=[*base, "rollout.workflow.options.max_turns=3", "rollout.workflow.system_prompt=''"])
    assert cfg.rollout.workflow.options == {"max_turns": 3} and cfg.rollout.workflow.system_prompt == ""
    with pytest.raises(ConfigError, match=r"rollout\.workflow\.options\.max_turn: unknown key"):
        load_config(overrides=[*base, "rollout.workflow.options.max_turn=3"])
    with pytest.raises(ConfigError, match="max_turns=0"):
        load_config(overrides=[*base, "rollout.workflow.options.max_turns=0"])
    with pytest.raises(ConfigError, match="unknown workflow 'nope'"):
        load_config(overrides=["rollout.workflow.name=nope"])


def test_the_job_workflow_gets_its_options_the_system_prompt_and_max_prompt_len() -> None:
    tok = FakeTokenizer()
    default = build_workflow(WorkflowConfig(), tok, SAMPLING, arith_reward, max_prompt_len=64)
    assert isinstance(default, RLVRWorkflow) and default.system_prompt == SYSTEM_PROMPT
    assert default.max_prompt_len == 64
    config = WorkflowConfig(name="multi_turn", system_prompt="", options={"max_turns": 4, "feedback": "No."})
    multi = build_workflow(config, tok, SAMPLING, arith_reward, max_prompt_len=None)
    assert isinstance(multi, MultiTurnWorkflow)
    assert (multi.max_turns, multi.feedback, multi.system_prompt, multi.turn_discount) == (4, "No.", "", 0.9)


@pytest.mark.parametrize("name", WORKFLOWS.names())
def test_docs_list_every_workflow_and_its_options(name: str) -> None:
    text = (ROOT / "docs" / "workflows.md").read_text(encoding="utf-8")
    heading = f"### `{name}`: "
    assert heading in text, f"docs/workflows.md has no section {heading!r}"
    section = text[text.index(heading) :].split("\n### ", 1)[0]
    for option in dataclasses.fields(WORKFLOWS.get(name).options_class):
        assert f"| `{option.name}` |" in section, f"docs/workflows.md does not list {name}'s option {option.name}"
