"""The RL tests' shared warm start: one SFT run of the demo task (configs/demo_grpo.yaml, 200 steps
of 64 demonstrations on 2 gloo workers), built once per session and used by every RL test here.

Each step's 32 demonstrations per rank go through the engine in 4 micro-batches of 8
(``actor.micro_batch.n_mbs=4``): the same gradient (the engine weights micro-batches by loss tokens;
the losses match the one-micro-batch run to 1e-7) in less time on CPU. One train worker instead
of two is not faster. Fewer or smaller steps do not do: 150 steps, or 200 of 32 demonstrations,
leave a warm start that RL barely improves in 20 steps. The timings and gains behind these choices:
docs/benchmarks_history.md, "CPU test runs"."""

from __future__ import annotations

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.sft import run_sft

CONFIG = "configs/demo_grpo.yaml"
SFT_STEPS = 200
SFT_MICRO_BATCHES = 4


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Directory of the warm-started HF model."""
    run_dir = tmp_path_factory.mktemp("warm_start")
    cfg = load_config(
        CONFIG,
        [
            f"experiment.run_dir={run_dir}",
            f"train.sft_warmup_steps={SFT_STEPS}",
            f"train.total_steps={SFT_STEPS + 1}",
            f"actor.micro_batch.n_mbs={SFT_MICRO_BATCHES}",
        ],
    )
    return str(run_sft(cfg))
