"""REINFORCE++ (Hu et al. 2025): critic-free, token-level KL in the reward, global normalisation.

Token reward ``r_t = [t = last] * r - beta * KL_t`` (k1 on trained tokens), advantage the
discounted reward-to-go ``A_t = sum_{s >= t} gamma^(s-t) r_s``, then normalised over all trained
tokens of the batch: ``(A - mean_batch) / (std_batch + eps)``. REINFORCE++-baseline
(``baseline="group"``) first subtracts the group mean reward from ``r``.

Departures: with ``kl_in_reward=false`` the KL becomes a loss term instead; the surrogate is the
decoupled PPO one (the paper also uses PPO's clipped ratio); batch statistics are per batch given
to ``compute_advantages`` (the whole train batch), not across data-parallel ranks.
"""

from __future__ import annotations

from areal_tasks.algo import keys
from areal_tasks.algo.base import Algorithm, Batch, register_algorithm, require
from areal_tasks.algo.gae import gae_packed
from areal_tasks.algo.normalize import normalize
from areal_tasks.config.algorithm import ReinforcePlusPlusConfig


@register_algorithm("reinforce_plus_plus")
class ReinforcePlusPlus(Algorithm):
    """Reward-to-go with a token-level KL penalty, normalised over the batch."""

    config_class = ReinforcePlusPlusConfig
    config: ReinforcePlusPlusConfig

    def compute_advantages(self, batch: Batch) -> Batch:
        require(batch, keys.LOSS_MASK, keys.CU_SEQLENS, why="REINFORCE++ advantages")
        c = self.config
        mask, cu = batch[keys.LOSS_MASK].bool(), batch[keys.CU_SEQLENS]
        rewards = self.shaped_rewards(batch)
        if c.baseline == "group":
            require(batch, keys.GROUP_IDS, why="REINFORCE++-baseline")
            rewards = normalize(rewards, mean_level="group", std_level="none", group_ids=batch[keys.GROUP_IDS])
        token_rewards = self.terminal_token_rewards(rewards, mask, cu)
        if self.needs_ref and c.kl_in_reward:
            token_rewards = token_rewards - c.kl_coef * self.token_kl(batch)
        returns, _ = gae_packed(token_rewards, None, mask, cu, c.gamma, 1.0)
        adv = normalize(returns, mean_level="batch", std_level="batch", mask=mask, eps=c.norm_eps)
        return {**batch, keys.ADVANTAGES: adv}
