"""The decoupled PPO actor loss through ``Algorithm.actor_loss_fn``: behaviour weight on by default,
proximal-policy resolution, entropy bonus and the KL loss term."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from areal_tasks.algo import build_algorithm
from areal_tasks.algo.kl import kl_estimate
from areal_tasks.algo.ratios import loglinear_prox_logprobs
from areal_tasks.config.algorithm import GRPOConfig
from areal_tasks.errors import AlgorithmError


def _setup(make_batch: Callable, **overrides: object) -> tuple:
    algo = build_algorithm(GRPOConfig(loss_agg_mode="token_mean", **overrides))
    batch = algo.compute_advantages(make_batch())
    logp = batch["logprobs"] + 0.1 * torch.randn(batch["logprobs"].shape, generator=torch.Generator().manual_seed(3))
    return algo, batch, logp.requires_grad_(True)


def test_behaviour_weight_is_on_by_default_and_changes_the_loss(make_batch: Callable) -> None:
    assert GRPOConfig().use_behav_imp_weight is True
    algo, batch, logp = _setup(make_batch)
    loss_on, stats = algo.actor_loss_fn({"logprobs": logp}, batch)
    off = build_algorithm(dataclasses.replace(algo.config, use_behav_imp_weight=False))
    loss_off, _ = off.actor_loss_fn({"logprobs": logp}, batch)
    assert abs(loss_on.item() - loss_off.item()) > 1e-4
    assert stats["behav_weight_mean"] != pytest.approx(1.0)
    # by hand: token mean of min(exp(prox - behav), cap) * surrogate(exp(logp - prox))
    mask = batch["loss_mask"]
    w = torch.exp(batch["prox_logprobs"] - batch["logprobs"]).clamp(max=5.0)
    r = torch.exp(logp.detach() - batch["prox_logprobs"])
    adv = batch["advantages"]
    surr = torch.maximum(-r * adv, -r.clamp(0.8, 1.2) * adv)
    assert loss_on.item() == pytest.approx(((w * surr)[mask]).mean().item(), rel=1e-5)


def test_behaviour_weight_is_one_when_behaviour_is_proximal(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch)
    batch["prox_logprobs"] = batch["logprobs"].clone()
    loss_on, stats = algo.actor_loss_fn({"logprobs": logp}, batch)
    off = build_algorithm(dataclasses.replace(algo.config, use_behav_imp_weight=False))
    assert loss_on.item() == pytest.approx(off.actor_loss_fn({"logprobs": logp}, batch)[0].item())
    assert stats["behav_weight_mean"] == pytest.approx(1.0)


def test_recompute_without_prox_logprobs_is_an_error(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch)
    assert algo.needs_prox_logprobs
    del batch["prox_logprobs"]
    with pytest.raises(AlgorithmError, match="prox_logprobs"):
        algo.actor_loss_fn({"logprobs": logp}, batch)


def test_loglinear_prox_from_versions_and_recomputed_prox_wins(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch, prox_approx="loglinear")
    assert not algo.needs_prox_logprobs
    with_prox, _ = algo.actor_loss_fn({"logprobs": logp}, batch)
    exact = build_algorithm(dataclasses.replace(algo.config, prox_approx="recompute"))
    assert with_prox.item() == pytest.approx(exact.actor_loss_fn({"logprobs": logp}, batch)[0].item())
    del batch["prox_logprobs"]
    approx_loss, _ = algo.actor_loss_fn({"logprobs": logp}, batch)
    batch["prox_logprobs"] = loglinear_prox_logprobs(batch["logprobs"], logp, batch["versions"], 3)
    assert approx_loss.item() == pytest.approx(exact.actor_loss_fn({"logprobs": logp}, batch)[0].item())
    del batch["prox_logprobs"], batch["seq_policy_version"]
    with pytest.raises(AlgorithmError, match="seq_policy_version"):
        algo.actor_loss_fn({"logprobs": logp}, batch)


def test_prox_none_clips_against_behaviour(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch, prox_approx="none")
    del batch["prox_logprobs"]
    loss, stats = algo.actor_loss_fn({"logprobs": logp}, batch)
    assert stats["behav_weight_mean"] == pytest.approx(1.0)
    batch["prox_logprobs"] = batch["logprobs"]
    assert loss.item() == pytest.approx(algo.actor_loss_fn({"logprobs": logp}, batch)[0].item())


def test_entropy_bonus(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch, entropy_coef=0.1)
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1))
    with pytest.raises(AlgorithmError, match="entropy"):
        algo.actor_loss_fn({"logprobs": logp}, batch)
    loss, stats = algo.actor_loss_fn({"logprobs": logp, "entropy": entropy}, batch)
    plain = build_algorithm(dataclasses.replace(algo.config, entropy_coef=0.0))
    mean_entropy = entropy[batch["loss_mask"]].mean().item()
    assert stats["entropy"] == pytest.approx(mean_entropy)
    assert loss.item() == pytest.approx(plain.actor_loss_fn({"logprobs": logp}, batch)[0].item() - 0.1 * mean_entropy)


def test_kl_loss_term(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch, kl_coef=0.5, kl_estimator="k3")
    assert algo.needs_ref
    loss, stats = algo.actor_loss_fn({"logprobs": logp}, batch)
    plain = build_algorithm(dataclasses.replace(algo.config, kl_coef=0.0))
    mask = batch["loss_mask"]
    kl = kl_estimate(logp.detach(), batch["ref_logprobs"], "k3")[mask].mean().item()
    assert stats["kl_ref"] == pytest.approx(kl, rel=1e-5)
    assert loss.item() == pytest.approx(plain.actor_loss_fn({"logprobs": logp}, batch)[0].item() + 0.5 * kl, rel=1e-5)
    batch["ref_logprobs"] = logp.detach().clone()
    assert algo.actor_loss_fn({"logprobs": logp}, batch)[1]["kl_ref"] == 0.0
    del batch["ref_logprobs"]
    with pytest.raises(AlgorithmError, match="ref_logprobs"):
        algo.actor_loss_fn({"logprobs": logp}, batch)


def test_stats_are_plain_floats(make_batch: Callable) -> None:
    algo, batch, logp = _setup(make_batch)
    _, stats = algo.actor_loss_fn({"logprobs": logp, "entropy": torch.rand(logp.shape)}, batch)
    assert {"loss", "pg_loss", "clip_frac", "approx_kl", "behav_weight_mean", "behav_weight_max", "entropy"} <= set(
        stats
    )
    assert all(type(v) is float for v in stats.values())
