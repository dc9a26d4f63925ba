"""PPO with a learned critic (Schulman et al. 2017) and GAE (Schulman et al. 2015).

Token reward ``r_t = [t = last] * r - beta * KL_t`` (KL folded into the reward, as in RLHF PPO;
off while ``kl_coef = 0``); ``A, R = GAE(r, V; gamma, lambda)`` over trained tokens; advantages
normalised over the batch (levels configurable). Actor: the decoupled PPO surrogate. Critic: the
clipped value loss (MSE or Huber) against the returns ``R``, averaged over trained tokens.

Departures: GAE skips untrained tokens and treats every sequence as terminal (see ``gae.py``);
the critic loss always uses ``token_mean`` whatever the actor's aggregation; the value clip is
absolute (``V_old +- value_clip``), as in PPO2 code.
"""

from __future__ import annotations

from areal_tasks.algo import keys
from areal_tasks.algo.actor import masked_mean_stat
from areal_tasks.algo.aggregate import aggregate_loss, loss_weight
from areal_tasks.algo.base import Algorithm, Batch, LossOutput, register_algorithm, require
from areal_tasks.algo.gae import gae_packed
from areal_tasks.algo.layout import broadcast_to_tokens
from areal_tasks.algo.losses import value_loss
from areal_tasks.algo.normalize import normalize
from areal_tasks.config.algorithm import PPOConfig


@register_algorithm("ppo")
class PPO(Algorithm):
    """Actor-critic PPO with GAE."""

    config_class = PPOConfig
    config: PPOConfig
    needs_critic = True

    def compute_advantages(self, batch: Batch) -> Batch:
        require(batch, keys.VALUES, keys.LOSS_MASK, keys.CU_SEQLENS, why="PPO advantages (critic values)")
        c = self.config
        mask, cu = batch[keys.LOSS_MASK].bool(), batch[keys.CU_SEQLENS]
        token_rewards = self.terminal_token_rewards(self.shaped_rewards(batch), mask, cu)
        if self.needs_ref and c.kl_in_reward:
            token_rewards = token_rewards - c.kl_coef * self.token_kl(batch)
        values = batch[keys.VALUES].to(token_rewards.dtype)
        adv, returns = gae_packed(token_rewards, values, mask, cu, c.gamma, c.gae_lambda)
        groups = None
        if "group" in (c.adv_norm_mean, c.adv_norm_std):
            require(batch, keys.GROUP_IDS, why="group-level advantage normalisation")
            groups = broadcast_to_tokens(batch[keys.GROUP_IDS], cu)
        adv = normalize(
            adv, mean_level=c.adv_norm_mean, std_level=c.adv_norm_std, group_ids=groups, mask=mask, eps=c.norm_eps
        )
        return {**batch, keys.ADVANTAGES: adv, keys.RETURNS: returns}

    def critic_loss_fn(self, outputs: Batch, mb: Batch) -> LossOutput:
        require(outputs, keys.VALUES, why="critic loss")
        require(mb, keys.VALUES, keys.RETURNS, keys.LOSS_MASK, keys.CU_SEQLENS, why="critic loss")
        c = self.config
        mask = mb[keys.LOSS_MASK].bool()
        per_token, clipped = value_loss(
            outputs[keys.VALUES], mb[keys.VALUES], mb[keys.RETURNS], c.value_clip, c.value_loss, c.huber_delta
        )
        loss = aggregate_loss(per_token, mask, mb[keys.CU_SEQLENS], "token_mean")
        stats = {
            "value_loss": float(loss.detach()),
            "value_clip_frac": masked_mean_stat(clipped.to(per_token.dtype), mask),
            "values_mean": masked_mean_stat(outputs[keys.VALUES], mask),
            "returns_mean": masked_mean_stat(mb[keys.RETURNS], mask),
        }
        return loss, stats

    def critic_loss_weight_fn(self, mb: Batch) -> float:
        return loss_weight(mb[keys.LOSS_MASK], mb[keys.CU_SEQLENS], "token_mean")
