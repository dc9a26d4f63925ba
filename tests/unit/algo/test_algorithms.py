"""Per-algorithm advantage computations and behaviours against hand-computed expectations."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch

from areal_tasks.algo import build_algorithm
from areal_tasks.algo.layout import broadcast_to_tokens
from areal_tasks.api.workflow import Trajectory
from areal_tasks.config.algorithm import (
    AlgorithmConfig,
    DAPOConfig,
    DrGRPOConfig,
    GRPOConfig,
    GSPOConfig,
    PPOConfig,
    ReinforcePlusPlusConfig,
    RLOOConfig,
)
from areal_tasks.errors import AlgorithmError

REWARDS = (1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # group 0 mixed, group 1 all equal


def _group(rewards: list[float]) -> list[Trajectory]:
    """A finished group of one-token trajectories with these rewards (what a group filter gets)."""
    return [Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], reward=r, prompt_len=1) for r in rewards]


def _seq_adv(batch: dict, adv: torch.Tensor) -> list[float]:
    """The single advantage each sequence carries on its trained tokens (asserts it is constant)."""
    out = []
    cu, mask = batch["cu_seqlens"].tolist(), batch["loss_mask"]
    for lo, hi in itertools.pairwise(cu):
        vals = adv[lo:hi][mask[lo:hi]]
        assert torch.allclose(vals, vals[0].expand_as(vals))
        assert torch.all(adv[lo:hi][~mask[lo:hi]] == 0)
        out.append(vals[0].item())
    return out


def test_grpo_group_normalised_and_zero_std_group_is_zero(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    out = build_algorithm(GRPOConfig()).compute_advantages(batch)
    a = 0.5 / math.sqrt(1 / 3)
    assert _seq_adv(batch, out["advantages"]) == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-5)
    assert "returns" not in out and "advantages" not in batch  # input left untouched


def test_dr_grpo_centres_without_std(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    out = build_algorithm(DrGRPOConfig()).compute_advantages(batch)
    assert _seq_adv(batch, out["advantages"]) == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


def test_rloo_leave_one_out(make_batch: Callable) -> None:
    batch = make_batch(rewards=(1.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0, 1.0))
    out = build_algorithm(RLOOConfig()).compute_advantages(batch)
    assert _seq_adv(batch, out["advantages"]) == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3, 4 / 3, 0, -4 / 3, 0])


def test_rloo_kl_in_reward_is_sequence_level(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    algo = build_algorithm(RLOOConfig(kl_coef=0.1))
    kl = algo.sequence_kl(batch)
    shifted = torch.tensor(REWARDS) - 0.1 * kl
    groups = [shifted[:4], shifted[4:]]
    expected = [(r - (g.sum() - r) / 3).item() for g in groups for r in g]
    assert _seq_adv(batch, algo.compute_advantages(batch)["advantages"]) == pytest.approx(expected, abs=1e-5)


def test_dapo_overlong_penalty_and_dynamic_sampling(make_batch: Callable) -> None:
    # trained lengths 4 3 5 2 | 4 3 1 2; L_max = 5, L_cache = 2: length 4 -> -0.5, 5 -> -1, <= 3 -> 0
    batch = make_batch(rewards=(1, 1, 1, 1, 0, 0, 0, 0))
    algo = build_algorithm(DAPOConfig(overlong_max_len=5, overlong_buffer_len=2))
    adv = _seq_adv(batch, algo.compute_advantages(batch)["advantages"])
    expected = []
    for shaped in (torch.tensor([0.5, 1.0, 0.0, 1.0]), torch.tensor([-0.5, 0.0, 0.0, 0.0])):
        expected += ((shaped - shaped.mean()) / (shaped.std() + 1e-6)).tolist()
    assert adv == pytest.approx(expected, abs=1e-5)
    keep = algo.group_filter
    assert keep is not None
    assert [keep(_group(batch["rewards"][i : i + 4].tolist())) for i in (0, 4)] == [False, False]
    assert [keep(_group([1.0, 1.0])), keep(_group([0.0, 1.0]))] == [False, True]
    keep_all = build_algorithm(DAPOConfig(dynamic_sampling=False))
    assert keep_all.group_filter is None  # the rollout side keeps every group
    assert DAPOConfig().eps_clip_high == 0.28 and DAPOConfig().loss_agg_mode == "token_mean"


def test_default_filter_keeps_everything() -> None:
    assert build_algorithm(GRPOConfig()).group_filter is None


def test_reinforce_pp_global_normalisation_and_token_kl(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    mask = batch["loss_mask"]
    no_kl = build_algorithm(ReinforcePlusPlusConfig(kl_coef=0.0)).compute_advantages(batch)["advantages"]
    raw = broadcast_to_tokens(torch.tensor(REWARDS), batch["cu_seqlens"])[mask]
    assert torch.allclose(no_kl[mask], (raw - raw.mean()) / raw.std(), atol=1e-5)
    with_kl = build_algorithm(ReinforcePlusPlusConfig(kl_coef=0.5)).compute_advantages(batch)["advantages"]
    assert with_kl[mask].mean().abs() < 1e-5 and with_kl[mask].std().item() == pytest.approx(1.0, abs=1e-4)
    lo, hi = batch["cu_seqlens"][0:2].tolist()
    assert len(set(with_kl[lo:hi][mask[lo:hi]].tolist())) > 1  # reward-to-go of the KL varies per token


def test_reinforce_pp_baseline_subtracts_group_mean(make_batch: Callable) -> None:
    batch = make_batch(rewards=(1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0))
    out = build_algorithm(ReinforcePlusPlusConfig(kl_coef=0.0, baseline="group")).compute_advantages(batch)
    adv = _seq_adv(batch, out["advantages"])
    assert adv[4:] == pytest.approx([adv[4]] * 4) and adv[0] > 0 > adv[1]  # group 1 centred to 0 before batch norm


def test_ppo_gae_returns_and_critic_loss(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    algo = build_algorithm(PPOConfig(gae_lambda=1.0, adv_norm_mean="none", adv_norm_std="none"))
    out = algo.compute_advantages(batch)
    mask = batch["loss_mask"]
    # gamma = lambda = 1: A_t = R - V_t on every trained token, returns = R
    seq_r = broadcast_to_tokens(torch.tensor(REWARDS), batch["cu_seqlens"])
    assert torch.allclose(out["advantages"][mask], (seq_r - batch["values"])[mask], atol=1e-5)
    assert torch.allclose(out["returns"][mask], seq_r[mask])
    values = batch["values"].clone().requires_grad_(True)
    loss, stats = algo.critic_loss_fn({"values": values}, out)
    loss.backward()
    assert torch.isfinite(values.grad).all() and stats["value_loss"] > 0
    assert algo.critic_loss_weight_fn(out) == float(mask.sum())
    del batch["values"]
    with pytest.raises(AlgorithmError, match="values"):
        algo.compute_advantages(batch)


def test_gspo_uses_sequence_level_ratio(make_batch: Callable) -> None:
    batch = make_batch(rewards=REWARDS)
    algo = build_algorithm(GSPOConfig(use_behav_imp_weight=False, eps_clip=0.5, eps_clip_high=0.5))
    out = algo.compute_advantages(batch)
    logp = batch["prox_logprobs"] + 0.05
    loss, _ = algo.actor_loss_fn({"logprobs": logp}, out)
    # every sequence has ratio exp(0.05): loss = -exp(0.05) * mean_i A_i over sequences
    seq_adv = torch.tensor(_seq_adv(batch, out["advantages"]))
    assert loss.item() == pytest.approx(-math.exp(0.05) * seq_adv.mean().item(), abs=1e-6)


def test_critic_free_algorithms_have_no_critic_loss(make_batch: Callable) -> None:
    algo = build_algorithm(GRPOConfig())
    with pytest.raises(AlgorithmError, match="no critic"):
        algo.critic_loss_fn({}, {})


def test_build_rejects_mismatched_config() -> None:
    with pytest.raises(AlgorithmError, match="GRPOConfig"):
        build_algorithm(AlgorithmConfig())
    assert type(build_algorithm(AlgorithmConfig.variant_class("gspo")())).__name__ == "GSPO"
