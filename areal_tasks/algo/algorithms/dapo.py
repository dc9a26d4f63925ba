"""DAPO (Yu et al. 2025): clip-higher, dynamic sampling, overlong reward shaping, token-level loss.

* Clip-higher: ratio clipped to ``[1 - 0.2, 1 + 0.28]`` (``eps_clip``, ``eps_clip_high``).
* Dynamic sampling: :attr:`DAPO.group_filter` drops groups whose rewards are all equal; the
  rollout side applies it as each group finishes and keeps sampling until the batch is full of
  informative groups.
* Overlong shaping: the soft length penalty of ``shaping.overlong_penalty`` is added to the reward.
* Token-level loss: ``token_mean`` aggregation over all trained tokens of the batch.
* Advantages: GRPO's group normalisation; no KL term.

Departures: the overlong length is the number of trained tokens; the filter tests "all rewards
equal" on raw rewards (before the overlong penalty), which is DAPO's accuracy test for 0/1
rewards; the behaviour weight of decoupled PPO is on (the paper trains synchronously).
"""

from __future__ import annotations

from areal_tasks.algo import keys
from areal_tasks.algo.algorithms.group import group_relative_advantages
from areal_tasks.algo.algorithms.grpo import GRPO
from areal_tasks.algo.base import Batch, register_algorithm
from areal_tasks.algo.filters import informative_group
from areal_tasks.algo.layout import segment_sum
from areal_tasks.algo.shaping import overlong_penalty
from areal_tasks.api.rollout import GroupFilter
from areal_tasks.config.algorithm import DAPOConfig


@register_algorithm("dapo")
class DAPO(GRPO):
    """GRPO plus DAPO's four techniques."""

    config_class = DAPOConfig
    config: DAPOConfig

    def compute_advantages(self, batch: Batch) -> Batch:
        c = self.config
        rewards = self.shaped_rewards(batch)
        if c.overlong_max_len is not None:
            mask, cu = batch[keys.LOSS_MASK], batch[keys.CU_SEQLENS]
            lengths = segment_sum(mask.to(rewards.dtype), cu)
            penalty = overlong_penalty(lengths, c.overlong_max_len, c.overlong_buffer_len, c.overlong_penalty_factor)
            rewards = rewards + penalty.to(rewards.dtype)
        return group_relative_advantages(self, batch, rewards, c.adv_norm_mean, c.adv_norm_std)

    @property
    def group_filter(self) -> GroupFilter | None:
        """Dynamic sampling: drop groups whose rewards are all equal (None when it is off)."""
        return informative_group if self.config.dynamic_sampling else None
