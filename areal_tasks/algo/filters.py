"""Group filters: DAPO's dynamic sampling keeps only groups whose rewards are not all equal.

Dynamic sampling (Yu et al. 2025, eq. 11) over-samples and drops prompts whose responses are all
correct or all wrong (accuracy 1 or 0): under group-relative advantages those groups contribute no
gradient but still dilute the batch. Departure: the test is "all rewards equal" on the raw rewards,
which equals DAPO's accuracy test for 0/1 rewards and generalises to graded rewards; a group of one
sample is all-equal and is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from areal_tasks.errors import AlgorithmError


def informative_groups(group_rewards: Sequence[Tensor]) -> Tensor:
    """Bool ``[n_groups]``: true for groups whose rewards are not all equal."""
    keep = [bool(r.numel() > 1 and (r.max() != r.min()).item()) for r in group_rewards]
    return torch.tensor(keep, dtype=torch.bool)


def informative_sequences(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Bool ``[B]``: true for sequences whose group's rewards are not all equal."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise AlgorithmError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [B]")
    _, index = torch.unique(group_ids, return_inverse=True)
    n = int(index.max()) + 1 if index.numel() else 0
    high = torch.full((n,), -torch.inf, dtype=torch.float64, device=rewards.device).scatter_reduce(
        0, index, rewards.to(torch.float64), reduce="amax"
    )
    low = torch.full((n,), torch.inf, dtype=torch.float64, device=rewards.device).scatter_reduce(
        0, index, rewards.to(torch.float64), reduce="amin"
    )
    return (high != low)[index]
