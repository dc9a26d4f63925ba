"""RLOO, REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics").

``A_i = r_i - 1/(k-1) sum_{j != i} r_j`` over the ``k`` samples of a prompt (no std division),
broadcast to all trained tokens; when ``kl_coef > 0`` the reward is ``r_i - beta * sum_t KL_t``
(sequence-level KL in the reward, the paper's form; k1 by default).

Departures: the paper optimises the plain REINFORCE objective on whole sequences; we use the
(decoupled) PPO clipped surrogate, which equals REINFORCE for the first update on fresh samples,
and ``token_mean`` aggregation (``seq_mean_token_sum`` reproduces the paper's sequence log-prob
gradient). A group of one sample gets advantage 0.
"""

from __future__ import annotations

from areal_tasks.algo.algorithms.group import group_relative_advantages
from areal_tasks.algo.base import Algorithm, Batch, register_algorithm
from areal_tasks.config.algorithm import RLOOConfig


@register_algorithm("rloo")
class RLOO(Algorithm):
    """Leave-one-out group baseline; no critic."""

    config_class = RLOOConfig

    def compute_advantages(self, batch: Batch) -> Batch:
        rewards = self.shaped_rewards(batch)
        return group_relative_advantages(self, batch, rewards, "group", "none", leave_one_out=True)
