"""The three agent examples learn on CPU: GRPO from the demo task's shared warm start raises the
mean eval reward of each, with the agent doing the generating and only the workflow changed.

* ``configs/agent_arealopenai.yaml``: ``examples/agents/calculator_agent.py`` in-process, through
  ``ArealOpenAI`` (the ``agent`` workflow);
* ``configs/agent_openai_sdk.yaml``: ``examples/agents/openai_sdk_agent.py``, an unmodified program on
  the official ``openai`` SDK, under a proxy session per episode (``agent_command``);
* ``configs/agent_openai_agents.yaml``: ``examples/agents/openai_agents_sdk_agent.py`` on the
  ``openai-agents`` SDK in ``.venv-agents`` (``make agents-env``), likewise.

Training and evaluation both run the agent (eval reward: the expected reward of the sampling
policy on the 100 held-out prompts). Budgets (``BUDGETS``): the in-process agent gets the one
``tests/integration/rl/test_learning.py`` measures ``rlvr`` with (30 steps of 64 episodes, lr 2e-4,
8 samples per eval prompt); the programs, whose episodes cost 40-75 ms of CPU each even forked, 30
steps of 32 episodes and 4 samples per eval prompt (a standard error of about 0.02 per evaluation,
against gains of 0.12-0.17). Each run prints its gain (``-s``); past gains: docs/agents.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.rl import run_train
from tests.fixtures.agents_env import agents_python

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

#: (RL steps, lr, eval samples per prompt, episodes per step) by config: the in-process agent gets
#: test_learning.py's budget; the programs' episodes cost 40-75 ms of CPU each even forked, so they get half the
#: episodes per step and half the evaluation.
BUDGETS = {"configs/agent_arealopenai.yaml": (30, 2e-4, 8, 64)}
PROGRAM_BUDGET = (30, 2e-4, 4, 32)
#: the smallest rise of the mean eval reward that counts as learning (test_learning.py's).
MIN_GAIN = 0.05


def rl(config: str, run_dir: Path, model: str) -> dict:
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
        ],
    )
    return run_train(cfg)


@pytest.mark.parametrize(
    "config",
    ["configs/agent_arealopenai.yaml", "configs/agent_openai_sdk.yaml", "configs/agent_openai_agents.yaml"],
)
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
