"""The three agent examples learn on CPU: GRPO from the demo task's shared warm start raises the
mean eval reward of each, with the agent doing the generating and only the workflow changed.

* ``configs/agent_arealopenai.yaml``: ``examples/agents/calculator_agent.py`` in-process, through
  ``ArealOpenAI`` (the ``agent`` workflow);
* ``configs/agent_openai_sdk.yaml``: ``examples/agents/openai_sdk_agent.py``, an unmodified program on
  the official ``openai`` SDK, under a proxy session per episode (``agent_command``);
* ``configs/agent_openai_agents.yaml``: ``examples/agents/openai_agents_sdk_agent.py`` on the
  ``openai-agents`` SDK in ``.venv-agents`` (``make agents-env``), likewise.

Training and evaluation both run the agent (eval reward: the expected reward of the sampling
policy on the 100 held-out prompts, ``EVAL_SAMPLES`` each: 8 in-process, 4 for the programs, whose
episodes cost about 50 ms of CPU each even forked; a standard error of about 0.02 per evaluation).
The RL budget is the one ``tests/integration/rl/test_learning.py`` measures ``rlvr`` with; each run
prints its gain (``-s``); past gains: docs/agents.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.rl import run_train
from tests.fixtures.agents_env import agents_python

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

RL_STEPS = 30
#: eval samples per prompt, by config (the programs' episodes are the expensive ones).
EVAL_SAMPLES = {"configs/agent_arealopenai.yaml": 8}
PROGRAM_EVAL_SAMPLES = 4
#: the smallest rise of the mean eval reward that counts as learning (test_learning.py's).
MIN_GAIN = 0.05


def rl(config: str, run_dir: Path, model: str) -> dict:
    samples = EVAL_SAMPLES.get(config, PROGRAM_EVAL_SAMPLES)
    cfg = load_config(
        config,
        [
            f"experiment.run_dir={run_dir}",
            f"model.path={model}",
            "train.sft_warmup_steps=0",
            f"train.total_steps={RL_STEPS}",
            "actor.optimizer.lr=2e-4",
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
