"""A reference model's log-probs reach the update: the trainer's own ``build_engines`` builds a
``ref`` engine for REINFORCE++ (``kl_coef > 0``), ``RLStep`` computes its log-probs, and the KL term
(in the reward, REINFORCE++'s default, or in the loss) changes the actor's update: the same step
against a reference that differs from the policy moves the weights differently than against one
equal to it. ``kl_ref/mean`` is logged: 0 against an equal reference, positive against another.
A step that ignored the reference's log-probs would update identically in both cases."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from areal_tasks.algo import build_algorithm
from areal_tasks.config import load_config
from areal_tasks.engine.registry import register_engine, unregister_engine
from areal_tasks.trainer.engines import build_engines
from areal_tasks.trainer.rl_step import RLStep
from tests.unit.engine.minimal_engine import BACKEND, MinimalEngine
from tests.unit.engine.test_minimal_engine import GROUP, _batch, _params


@pytest.fixture
def registered():
    register_engine(BACKEND, MinimalEngine, dims="d")
    yield
    unregister_engine(BACKEND)


def _job(tmp_path, kl_in_reward: bool):
    cfg = load_config(
        None,
        [
            f"experiment.run_dir={tmp_path}",
            "algorithm.name=reinforce_plus_plus",
            "algorithm.kl_coef=0.5",
            f"algorithm.kl_in_reward={str(kl_in_reward).lower()}",
            "algorithm.baseline=group",
            f"rollout.group_size={GROUP}",
            f"train.batch_size={2 * GROUP}",
            "actor.optimizer.lr=1e-3",
            "ref.backend=fsdp",
        ],
    )
    actor = dataclasses.replace(cfg.actor, backend=BACKEND)
    return dataclasses.replace(cfg, actor=actor, ref=dataclasses.replace(cfg.ref, backend=BACKEND))


def _step(cfg, model_dir: str, perturb_ref: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    engines = build_engines(cfg, model_dir, n_steps=2)
    assert set(engines) == {"actor", "ref"}, "kl_coef > 0 must build a reference engine"
    if perturb_ref:
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in engines["ref"].model.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
    step = RLStep(engines["actor"], build_algorithm(cfg.algorithm), GROUP, ref=engines["ref"])
    stats = step.run(_batch(engines["actor"].model.config.vocab_size))
    return _params(engines["actor"]), stats


@pytest.mark.parametrize("kl_in_reward", [True, False], ids=["kl_in_reward", "kl_in_loss"])
def test_the_reference_changes_the_update(registered, tmp_path, tiny_qwen2, kl_in_reward: bool) -> None:
    cfg = _job(tmp_path, kl_in_reward)
    same, same_stats = _step(cfg, str(tiny_qwen2), perturb_ref=False)
    other, other_stats = _step(cfg, str(tiny_qwen2), perturb_ref=True)
    # the policy side of the KL is the recomputed proximal log-probs: equal to the reference's here
    assert same_stats["kl_ref/mean"] == pytest.approx(0.0, abs=1e-6)
    assert other_stats["kl_ref/mean"] > 0.01 and torch.isfinite(torch.tensor(other_stats["kl_ref/mean"]))
    moved = max(float((same[k] - other[k]).abs().max()) for k in same)
    assert moved > 1e-6, "the actor's update did not depend on the reference model's log-probs"
    if not kl_in_reward:
        assert other_stats["actor/kl_ref"] > same_stats["actor/kl_ref"]
