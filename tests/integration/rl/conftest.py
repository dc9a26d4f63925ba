"""The RL tests' shared warm start: one SFT run of the demo task (configs/demo_grpo.yaml, 200 steps
of 64 demonstrations on 2 gloo workers), built once per session and used by every RL test here."""

from __future__ import annotations

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.sft import run_sft

CONFIG = "configs/demo_grpo.yaml"
SFT_STEPS = 200


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Directory of the warm-started HF model."""
    run_dir = tmp_path_factory.mktemp("warm_start")
    cfg = load_config(CONFIG, [f"experiment.run_dir={run_dir}", f"train.sft_warmup_steps={SFT_STEPS}",
                               f"train.total_steps={SFT_STEPS + 1}"])  # fmt: skip
    return str(run_sft(cfg))
