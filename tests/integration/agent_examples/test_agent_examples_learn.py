"""The three agent examples learn on CPU: GRPO from the demo task's shared warm start raises the
mean eval reward of each, with the agent doing the generating and only the workflow changed.

* ``configs/agent_arealopenai.yaml``: ``examples/agents/calculator_agent.py`` in-process, through
  ``ArealOpenAI`` (the ``agent`` workflow);
* ``configs/agent_openai_sdk.yaml``: ``examples/agents/openai_sdk_agent.py``, an unmodified program on
  the official ``openai`` SDK, under a proxy session per episode (``agent_command``);
* ``configs/agent_openai_agents.yaml``: ``examples/agents/openai_agents_sdk_agent.py`` on the
  ``openai-agents`` SDK in ``.venv-agents`` (``make agents-env``), likewise.

In `make test` the ``openai-agents`` program gets a short run instead (4 RL steps of 16 episodes, 8 eval
prompts): its episodes go through the same ``agent_command`` path and proxy as the ``openai`` program's,
whose learning is checked, and its learning run costs about 110 s of the suite's time budget;
``AREAL_AGENT_LEARNING_ALL=1`` runs it to the learning budget too.

Training and evaluation both run the agent (eval reward: the expected reward of the sampling
policy on the 100 held-out prompts). Budgets (``BUDGETS``): the in-process agent gets the one
``tests/integration/rl/test_learning.py`` measures ``rlvr`` with (30 steps of 64 episodes, lr 2e-4,
8 samples per eval prompt); the programs, whose episodes cost 40-75 ms of CPU each even forked, 30
steps of 48 episodes and 4 samples per eval prompt (a standard error of about 0.02 per evaluation,
about 0.03 on a gain). 32 episodes a step were too few: the openai program gained 0.042, 0.065 and
0.078 in three runs (one CI failure); 48 gained 0.130. Each run prints its gain (``-s``); past
gains: docs/agents.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.rl import run_train
from tests.fixtures.agents_env import agents_python

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

#: (RL steps, lr, eval samples per prompt, episodes per step) by config: the in-process agent gets
#: test_learning.py's budget; the programs' episodes cost 40-75 ms of CPU each even forked, so they get three
#: quarters of the episodes per step and half the evaluation.
BUDGETS = {"configs/agent_arealopenai.yaml": (30, 2e-4, 8, 64)}
PROGRAM_BUDGET = (30, 2e-4, 4, 48)
#: the smallest rise of the mean eval reward that counts as learning (test_learning.py's).
MIN_GAIN = 0.05


#: the openai-agents program's short run in `make test`: (RL steps, episodes per step, eval prompts).
SHORT_RUN = (4, 16, 8)
OPENAI_AGENTS = "configs/agent_openai_agents.yaml"
LEARNING = ["configs/agent_arealopenai.yaml", "configs/agent_openai_sdk.yaml"]
if os.environ.get("AREAL_AGENT_LEARNING_ALL") == "1":
    LEARNING.append(OPENAI_AGENTS)


def rl(config: str, run_dir: Path, model: str, *extra: str) -> dict:
    steps, lr, samples, batch = BUDGETS.get(config, PROGRAM_BUDGET)
    cfg = load_config(
        config,
        [
            f"experiment.run_dir={run_dir}",
            f"model.path={model}",
            "train.sft_warmup_steps=0",
            f"train.total_steps={steps}",
            f"actor.optimizer.lr={lr}",
            f"train.batch_size={batch}",
            "saver.freq_steps=null",
            f"evaluation.n_samples={samples}",
            *extra,
        ],
    )
    return run_train(cfg)


def test_the_openai_agents_program_trains(tmp_path: Path, warm_start: str) -> None:
    """A short run of the openai-agents program: every step trains on its episodes, rewarded (not a learning check)."""
    agents_python()  # skips, naming `make agents-env`, when .venv-agents is absent
    steps, batch, prompts = SHORT_RUN
    run = rl(
        OPENAI_AGENTS,
        tmp_path,
        warm_start,
        f"train.total_steps={steps}",
        f"train.batch_size={batch}",
        f"evaluation.max_eval_prompts={prompts}",
    )
    rows = [json.loads(line) for line in (tmp_path / "rl_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, steps + 1))
    assert all(row["rollout/n_samples"] == batch for row in rows), rows
    assert all(0.0 <= row["reward/mean"] <= 1.0 for row in rows)
    assert max(row["reward/max"] for row in rows) == 1.0  # the warm start answers some prompts right through the SDK
    assert run["eval_prompts"] == prompts


@pytest.mark.parametrize("config", LEARNING)
def test_the_agent_example_learns(config: str, tmp_path: Path, warm_start: str) -> None:
    if "openai_agents" in config:
        agents_python()  # skips, naming `make agents-env`, when .venv-agents is absent
    run = rl(config, tmp_path, warm_start)
    gain = run["reward_after"] - run["reward_before"]
    print(
        f"\n[agent examples] {config}: eval reward {run['reward_before']:.3f} -> {run['reward_after']:.3f} "
        f"(gain {gain:.3f}, MIN_GAIN {MIN_GAIN}) in {run['wall_seconds']:.0f} s"
    )
    assert run["reward_after"] >= run["reward_before"] + MIN_GAIN, run
