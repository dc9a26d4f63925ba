"""Group-relative advantages shared by GRPO, Dr.GRPO, DAPO, GSPO and RLOO.

``A_i = normalize(r_i)`` over the group of samples of one prompt (mean and std levels from the
config, leave-one-out for RLOO), broadcast to every trained token of sequence ``i``. When a KL
penalty is folded into the reward it is sequence-level, ``r_i - beta * sum_t KL_t``, as in RLOO.

Departure: GRPO's paper adds KL as a loss term; folding it into the reward (``kl_in_reward``) is
our option, at sequence level so that all tokens of a sample keep one advantage.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.algo import keys
from areal_tasks.algo.base import Algorithm, Batch, require
from areal_tasks.algo.layout import broadcast_to_tokens
from areal_tasks.algo.normalize import normalize


def group_relative_advantages(
    algo: Algorithm, batch: Batch, rewards: Tensor, mean_level: str, std_level: str, leave_one_out: bool = False
) -> Batch:
    """``batch`` plus ``advantages`` [T] from sequence ``rewards`` [B] normalised within groups."""
    require(batch, keys.GROUP_IDS, keys.LOSS_MASK, keys.CU_SEQLENS, why="group-relative advantages")
    c = algo.config
    if algo.needs_ref and c.kl_in_reward:
        rewards = rewards - c.kl_coef * algo.sequence_kl(batch)
    seq_adv = normalize(
        rewards,
        mean_level=mean_level,
        std_level=std_level,
        group_ids=batch[keys.GROUP_IDS],
        leave_one_out=leave_one_out,
        eps=c.norm_eps,
    )
    mask = batch[keys.LOSS_MASK].bool()
    adv = torch.where(mask, broadcast_to_tokens(seq_adv, batch[keys.CU_SEQLENS]), 0.0)
    return {**batch, keys.ADVANTAGES: adv}
