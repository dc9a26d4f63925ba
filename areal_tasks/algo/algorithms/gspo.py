"""GSPO (Zheng et al. 2025, Qwen): the importance ratio and its clipping at sequence level.

``s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t log-ratio)``; the objective
``1/G sum_i min(s_i A_i, clip(s_i, 1 - 3e-4, 1 + 4e-4) A_i)`` with GRPO's group-normalised ``A_i``.
We broadcast ``s_i`` to the sequence's tokens and aggregate with ``seq_mean_token_mean``, which
equals the sequence-level objective exactly (every token of a sequence carries the same term) and
its gradient is GSPO's ``A_i * s_i * mean_t grad log pi``.

Departures: the ratio is taken against the proximal policy of decoupled PPO, and the behaviour
weight defaults to sequence level (``behav_imp_weight_level="sequence"``) so the whole correction
is per sequence, in GSPO's spirit.
"""

from __future__ import annotations

from areal_tasks.algo.algorithms.grpo import GRPO
from areal_tasks.algo.base import register_algorithm
from areal_tasks.config.algorithm import GSPOConfig


@register_algorithm("gspo")
class GSPO(GRPO):
    """GRPO advantages with a sequence-level, length-normalised ratio."""

    config_class = GSPOConfig
    ratio_level = "sequence"
