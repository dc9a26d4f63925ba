"""RL on the archon engine learns on CPU: GRPO on the demo task ("which is larger") raises the
mean eval reward with the actor on archon, for a dense tiny model split into two pipeline stages
(``embedded:d1+archon:p2``) and for a tiny MoE model with its experts split over two ranks
(``embedded:d1+archon:d2e2``; ``archon:e2`` alone means ``d1e2``, which the allocation grammar
refuses because e must divide d*c).

The dense run starts from the session's warm start (``tests/fixtures/warm_start.py``, trained on
the FSDP engine). The MoE model (the kit's ``qwen3_moe`` at the demo's width: 4 experts, top-2)
gets its own short SFT warm start, on archon at the RL run's layout, so RL has signal. The
embedded server serves the MoE model with transformers and loads archon's per-expert weight
updates through ``weights/expert_fold.py``. Same eval and margin as test_learning.py; each run
prints its gain with ``-s``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trainer.rl import run_train
from areal_tasks.trainer.sft import run_sft

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

CONFIG = "configs/demo_grpo.yaml"
RL_STEPS = 30
MOE_SFT_STEPS = 200
#: the smallest rise of the mean eval reward that counts as learning (as in test_learning.py).
MIN_GAIN = 0.05
MOE_MODEL = "tiny:qwen3_moe?hidden_size=128&num_attention_heads=4&num_key_value_heads=2&moe_intermediate_size=128"
ARCHON = ["actor.backend=archon"]


def rl(run_dir: Path, model: str, allocation: str) -> dict:
    cfg = load_config(
        CONFIG,
        [
            f"experiment.run_dir={run_dir}",
            f"model.path={model}",
            f"allocation={allocation}",
            *ARCHON,
            "train.sft_warmup_steps=0",
            f"train.total_steps={RL_STEPS}",
            "actor.optimizer.lr=2e-4",
            "saver.freq_steps=null",
            "evaluation.n_samples=8",
            "rollout.max_head_offpolicyness=0",
        ],
    )
    return run_train(cfg)


def report(name: str, run: dict) -> None:
    gain = run["reward_after"] - run["reward_before"]
    print(
        f"\n[test_archon_rl] {name}: eval reward {run['reward_before']:.3f} -> {run['reward_after']:.3f} "
        f"(gain {gain:.3f}, MIN_GAIN {MIN_GAIN}) in {run['wall_seconds']:.0f} s"
    )


@pytest.fixture(scope="module")
def moe_warm_start(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny MoE model after a short SFT of the demo task on archon (``d2e2``)."""
    cfg = load_config(
        CONFIG,
        [
            f"experiment.run_dir={tmp_path_factory.mktemp('moe_warm_start')}",
            f"model.path={MOE_MODEL}",
            "allocation=embedded:d1+archon:d2e2",
            *ARCHON,
            f"train.sft_warmup_steps={MOE_SFT_STEPS}",
            f"train.total_steps={MOE_SFT_STEPS + 1}",
            "actor.micro_batch.n_mbs=4",
        ],
    )
    return str(run_sft(cfg))


def test_grpo_on_archon_pipeline_stages_raises_the_eval_reward(tmp_path: Path, warm_start: str) -> None:
    run = rl(tmp_path, warm_start, "embedded:d1+archon:p2")
    report("dense, archon:p2", run)
    assert run["reward_after"] >= run["reward_before"] + MIN_GAIN, run


def test_grpo_on_archon_expert_parallel_moe_raises_the_eval_reward(tmp_path: Path, moe_warm_start: str) -> None:
    run = rl(tmp_path, moe_warm_start, "embedded:d1+archon:d2e2")
    report("moe, archon:d2e2", run)
    assert run["reward_after"] >= run["reward_before"] + MIN_GAIN, run
