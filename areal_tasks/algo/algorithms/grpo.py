"""GRPO (Shao et al. 2024, DeepSeekMath) and Dr.GRPO (Liu et al. 2025).

GRPO: ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` on every token of sample ``i``, the
clipped surrogate, and the loss ``1/G sum_i 1/|o_i| sum_t L_it`` (``seq_mean_token_mean``).
Dr.GRPO removes the two biases: no std division (``adv_norm_std="none"``) and a constant
normaliser instead of ``|o_i|`` (``seq_mean_token_sum_norm`` with ``loss_agg_constant``); it is the
same object with a different config.

Departures: decoupled PPO (proximal policy + behaviour weight) replaces the paper's ``pi_old``; the
KL term is off by default (paper: ``beta = 0.04`` with k3 as a loss term, ``kl_coef=0.04``
reproduces it); the std is Bessel-corrected.
"""

from __future__ import annotations

from areal_tasks.algo.algorithms.group import group_relative_advantages
from areal_tasks.algo.base import Algorithm, Batch, register_algorithm
from areal_tasks.config.algorithm import DrGRPOConfig, GRPOConfig


@register_algorithm("grpo")
class GRPO(Algorithm):
    """Group-normalised rewards as advantages; no critic."""

    config_class = GRPOConfig
    config: GRPOConfig

    def compute_advantages(self, batch: Batch) -> Batch:
        c = self.config
        return group_relative_advantages(self, batch, self.shaped_rewards(batch), c.adv_norm_mean, c.adv_norm_std)


@register_algorithm("dr_grpo")
class DrGRPO(GRPO):
    """GRPO done right: mean-centred rewards only, constant loss normaliser."""

    config_class = DrGRPOConfig
