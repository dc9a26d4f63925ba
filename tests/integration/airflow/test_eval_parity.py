"""The evaluation operator scores a checkpoint as the trainer scored the same weights.

The registry gates ``champion`` on the evaluation operator's ``eval/reward``, so it must measure what
the trainer's own after-RL evaluation (``reward_after``) measures. It once did not: every request
carried the same sampling seed, so all eval prompts shared one random draw, and a demo checkpoint
the trainer scored 0.60 was registered at 0.43.

A tiny real run: ``run_train`` (no SFT, one GRPO step, a checkpoint at the end, the trainer's
evaluations before and after), then :class:`EvaluateCheckpointOperator` on the final checkpoint (HF
export, embedded server, evaluate). The model is the demo's tiny Qwen2 at random initialisation with
every attention and MLP output projection zeroed: a bigram model whose next-token distribution
does not depend on the prompt, so a seed shared by all requests would give every prompt the same
completion and make the score 0 or 1. A random model scores ~0 on arithmetic, where any two
evaluations agree, so the job's reward here is a coin that this model wins about half the time:
the parity of the completion's bytes (it goes through ``rollout.reward.fn`` as an import path,
which both sides must honour). The two numbers must agree within sampling noise: 64 prompts x 4
samples each, a tolerance of 4 standard errors of their difference. About 60 s on 2 cores.
"""

from __future__ import annotations

import math
import os
import shutil
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow]

N_PROMPTS = 64
N_SAMPLES = 4
REWARD_MODULE = "eval_parity_reward"

DEMO_MODEL = "tiny:qwen2?hidden_size=128&intermediate_size=256&num_attention_heads=4&num_key_value_heads=2"

REWARD_SOURCE = textwrap.dedent(
    '''
    """A coin for a random model: 1.0 when the completion's UTF-8 bytes sum to an even number."""


    def byte_parity(completion: str, answer: str, **kwargs: object) -> float:
        return 1.0 if sum(completion.encode("utf-8")) % 2 == 0 else 0.0
    '''
)


def bigram_model(out: Path, seed: int) -> Path:
    """The demo's tiny model with every residual branch's output projection zeroed (see the docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal_tasks.models import build_tiny_model
    from areal_tasks.models.tiny.spec import parse_tiny_spec

    family, overrides = parse_tiny_spec(DEMO_MODEL)
    shutil.copytree(build_tiny_model(family, seed=seed, **overrides), out)  # tokenizer and chat template
    model = AutoModelForCausalLM.from_pretrained(out)
    zeroed = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight")):
                param.zero_()
                zeroed += 1
    assert zeroed >= 2 * model.config.num_hidden_layers
    model.save_pretrained(out)
    return out


def test_operator_eval_matches_the_trainers_after_rl_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_tasks.config import load_config
    from areal_tasks.trainer.rl import run_train
    from operators.operators.evaluation import EvaluateCheckpointOperator

    # the reward module is imported by this process (config check, the operator's evaluation) and
    # by the job's processes (server, RL worker, reward workers), which inherit PYTHONPATH
    (tmp_path / f"{REWARD_MODULE}.py").write_text(REWARD_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    storage = (tmp_path / "storage").as_uri()
    overrides = [
        f"model.path={bigram_model(tmp_path / 'model', seed=1)}",
        f"experiment.run_dir={tmp_path / 'run'}",
        f"storage.url={storage}",
        "allocation=embedded:d1+fsdp:d1",
        f"dataset.path=demo:arithmetic?digits=2&ops=>&n_train=64&n_eval={N_PROMPTS}",
        "train.sft_warmup_steps=0",
        "train.total_steps=1",
        "train.batch_size=8",
        "rollout.group_size=4",
        "actor.micro_batch.granularity=4",
        "rollout.sampling.max_new_tokens=3",
        f"rollout.reward.fn={REWARD_MODULE}:byte_parity",
        "evaluation.temperature=1.0",
        f"evaluation.n_samples={N_SAMPLES}",
        "saver.freq_steps=1",
    ]
    cfg = load_config("configs/demo_grpo.yaml", overrides)
    summary = run_train(cfg)
    trainer = summary["reward_after"]
    assert summary["eval_samples_per_prompt"] == N_SAMPLES and summary["eval_prompts"] == N_PROMPTS
    # a coin the random model wins sometimes and loses sometimes: otherwise any two numbers agree
    assert 0.2 < trainer < 0.8, f"the test reward should be a coin for a random model, trainer scored {trainer}"

    checkpoints = f"{storage}/{cfg.experiment.name}/{cfg.experiment.trial}/checkpoints"
    operator = EvaluateCheckpointOperator(
        task_id="evaluate_checkpoint", config="configs/demo_grpo.yaml", checkpoint=checkpoints, overrides=overrides
    )
    result = operator.execute({})
    assert result["step"] == 1 and result["n_prompts"] == N_PROMPTS and result["n_samples"] == N_SAMPLES
    evaluated = result["metrics"]["eval/reward"]
    n = N_PROMPTS * N_SAMPLES
    p = (trainer + evaluated) / 2
    tolerance = 4 * math.sqrt(2 * max(p * (1 - p), 0.1) / n)  # 4 standard errors of a difference of two means
    assert abs(evaluated - trainer) <= tolerance, (
        f"operator eval/reward {evaluated:.3f} vs the trainer's reward_after {trainer:.3f} on the same weights "
        f"(difference over {tolerance:.3f}: the two evaluations do not measure the same thing)"
    )
