"""The agent examples agree with the calculator task they are trained on: each black-box script's
instructions are the task's system prompt (the SFT warm start's), read from its source, since the
openai-agents one imports only in ``.venv-agents``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from areal_tasks.datasets.calculator import SYSTEM_PROMPT

AGENTS = Path(__file__).resolve().parents[3] / "examples" / "agents"


def _constant(path: Path, name: str) -> object:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} defines no {name}")


@pytest.mark.parametrize("script", ["openai_sdk_agent.py", "openai_agents_sdk_agent.py"])
def test_black_box_instructions_are_the_task_system_prompt(script: str) -> None:
    assert _constant(AGENTS / script, "INSTRUCTIONS") == SYSTEM_PROMPT


def test_every_example_has_a_docstring_and_stays_small() -> None:
    for path in sorted(AGENTS.glob("*.py")):
        assert ast.get_docstring(ast.parse(path.read_text())), path.name
        assert len(path.read_text().splitlines()) < 300, path.name
